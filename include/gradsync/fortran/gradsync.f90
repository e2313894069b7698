! gradsync: the Fortran module over the C interface (include/gradsync/gradsync_c.h).
! CMake: find_package(GradSync CONFIG REQUIRED COMPONENTS fortran); link GradSync::fortran.
!
!   use gradsync
!   type(gradsync_t) :: gs
!   call gradsync_create(gs, MPI_COMM_WORLD, ierr)           ! mpi_f08: MPI_COMM_WORLD%MPI_VAL
!   call gradsync_add(gs, grad_w, GRADSYNC_DATA_PARALLEL, "w", ierr)   ! real32/real64, rank 1 or 2
!   call gradsync_add_ptr(gs, c_loc(g4), size(g4, kind=c_int64_t), GRADSYNC_FLOAT, GRADSYNC_LOCAL, "g4", ierr) ! any rank
!   call gradsync_synchronize(gs, done, ierr)                ! done: logical, a step completed
!   call gradsync_destroy(gs, ierr)
!
! ierr is GRADSYNC_OK (0) or an error code; gradsync_last_error() returns the message. Arrays given
! to gradsync_add must stay at their address while the handle lives (allocated once, not
! reallocated; declare them `target` or allocatable). Only host memory.
module gradsync
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer(c_int), parameter, public :: GRADSYNC_OK = 0, GRADSYNC_ERR_INVALID_HANDLE = 1, &
       GRADSYNC_ERR_INVALID_ARGUMENT = 2, GRADSYNC_ERR_MISMATCH = 3, GRADSYNC_ERR_STALL = 4, &
       GRADSYNC_ERR_CONFIG = 5, GRADSYNC_ERR_RUNTIME = 6, GRADSYNC_ERR_INTERNAL = 7
  integer(c_int32_t), parameter, public :: GRADSYNC_FLOAT = 1, GRADSYNC_DOUBLE = 2
  integer(c_int32_t), parameter, public :: GRADSYNC_DATA_PARALLEL = 0, GRADSYNC_LOCAL_SCALED = 1, GRADSYNC_LOCAL = 2
  integer(c_int32_t), parameter, public :: GRADSYNC_AVERAGE = 0, GRADSYNC_SUM = 1

  !> Mirrors struct gradsync_options.
  type, bind(c), public :: gradsync_options
    integer(c_int32_t) :: op
    integer(c_int32_t) :: backward_passes_per_step
    integer(c_int32_t) :: average_aggregated_gradients
    integer(c_int32_t) :: read_environment
    real(c_double) :: prescale_factor
    real(c_double) :: postscale_factor
  end type

  !> Mirrors struct gradsync_stats.
  type, bind(c), public :: gradsync_stats
    integer(c_int64_t) :: bytes_allreduced
    integer(c_int64_t) :: allreduce_calls
    integer(c_int64_t) :: passes
    integer(c_int64_t) :: steps
  end type

  !> The handle.
  type, public :: gradsync_t
    type(c_ptr) :: h = c_null_ptr
  end type

  public :: gradsync_options_init, gradsync_create, gradsync_add, gradsync_synchronize, gradsync_get_stats
  public :: gradsync_size, gradsync_rank, gradsync_destroy, gradsync_last_error, gradsync_add_ptr

  interface gradsync_add
    module procedure add_r4_1, add_r4_2, add_r8_1, add_r8_2
  end interface

  interface
    integer(c_int) function c_options_init(o) bind(c, name="gradsync_options_init")
      import :: c_int, gradsync_options
      type(gradsync_options), intent(out) :: o
    end function
    integer(c_int) function c_create(comm, o, out) bind(c, name="gradsync_create")
      import :: c_int, c_ptr
      integer(c_int), value :: comm  ! MPI_Fint (int in Open MPI and MPICH)
      type(c_ptr), value :: o
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_add(h, data, count, dtype, kind, name) bind(c, name="gradsync_add")
      import :: c_int, c_ptr, c_int64_t, c_int32_t, c_char
      type(c_ptr), value :: h, data
      integer(c_int64_t), value :: count
      integer(c_int32_t), value :: dtype, kind
      character(kind=c_char), dimension(*), intent(in) :: name
    end function
    integer(c_int) function c_synchronize(h, done) bind(c, name="gradsync_synchronize")
      import :: c_int, c_ptr, c_int32_t
      type(c_ptr), value :: h
      integer(c_int32_t), intent(out) :: done
    end function
    integer(c_int) function c_get_stats(h, s) bind(c, name="gradsync_get_stats")
      import :: c_int, c_ptr, gradsync_stats
      type(c_ptr), value :: h
      type(gradsync_stats), intent(out) :: s
    end function
    integer(c_int) function c_size(h, n) bind(c, name="gradsync_size")
      import :: c_int, c_ptr, c_int32_t
      type(c_ptr), value :: h
      integer(c_int32_t), intent(out) :: n
    end function
    integer(c_int) function c_rank(h, n) bind(c, name="gradsync_rank")
      import :: c_int, c_ptr, c_int32_t
      type(c_ptr), value :: h
      integer(c_int32_t), intent(out) :: n
    end function
    integer(c_int) function c_destroy(h) bind(c, name="gradsync_destroy")
      import :: c_int, c_ptr
      type(c_ptr), intent(inout) :: h
    end function
    type(c_ptr) function c_last_error() bind(c, name="gradsync_last_error")
      import :: c_ptr
    end function
    integer(c_size_t) function c_strlen(s) bind(c, name="strlen")
      import :: c_size_t, c_ptr
      type(c_ptr), value :: s
    end function
  end interface

contains

  subroutine gradsync_options_init(o, ierr)
    type(gradsync_options), intent(out) :: o
    integer, intent(out) :: ierr
    ierr = c_options_init(o)
  end subroutine

  !> Collective over comm (a Fortran communicator handle). options is optional.
  subroutine gradsync_create(gs, comm, ierr, options)
    type(gradsync_t), intent(out) :: gs
    integer, intent(in) :: comm
    integer, intent(out) :: ierr
    type(gradsync_options), intent(in), target, optional :: options
    if (present(options)) then
      ierr = c_create(int(comm, c_int), c_loc(options), gs%h)
    else
      ierr = c_create(int(comm, c_int), c_null_ptr, gs%h)
    end if
  end subroutine

  function c_name(name) result(s)
    character(len=*), intent(in) :: name
    character(kind=c_char, len=len(name) + 1) :: s
    s = name // c_null_char
  end function

  subroutine add_r4_1(gs, a, kind, name, ierr)
    type(gradsync_t), intent(in) :: gs
    real(c_float), intent(inout), target, contiguous :: a(:)
    integer, intent(in) :: kind
    character(len=*), intent(in) :: name
    integer, intent(out) :: ierr
    ierr = c_add(gs%h, c_loc(a), int(size(a), c_int64_t), GRADSYNC_FLOAT, int(kind, c_int32_t), c_name(name))
  end subroutine

  subroutine add_r4_2(gs, a, kind, name, ierr)
    type(gradsync_t), intent(in) :: gs
    real(c_float), intent(inout), target, contiguous :: a(:, :)
    integer, intent(in) :: kind
    character(len=*), intent(in) :: name
    integer, intent(out) :: ierr
    ierr = c_add(gs%h, c_loc(a), int(size(a), c_int64_t), GRADSYNC_FLOAT, int(kind, c_int32_t), c_name(name))
  end subroutine

  subroutine add_r8_1(gs, a, kind, name, ierr)
    type(gradsync_t), intent(in) :: gs
    real(c_double), intent(inout), target, contiguous :: a(:)
    integer, intent(in) :: kind
    character(len=*), intent(in) :: name
    integer, intent(out) :: ierr
    ierr = c_add(gs%h, c_loc(a), int(size(a), c_int64_t), GRADSYNC_DOUBLE, int(kind, c_int32_t), c_name(name))
  end subroutine

  subroutine add_r8_2(gs, a, kind, name, ierr)
    type(gradsync_t), intent(in) :: gs
    real(c_double), intent(inout), target, contiguous :: a(:, :)
    integer, intent(in) :: kind
    character(len=*), intent(in) :: name
    integer, intent(out) :: ierr
    ierr = c_add(gs%h, c_loc(a), int(size(a), c_int64_t), GRADSYNC_DOUBLE, int(kind, c_int32_t), c_name(name))
  end subroutine

  !> Any contiguous array (any rank): its address (c_loc), element count and GRADSYNC_FLOAT/DOUBLE.
  subroutine gradsync_add_ptr(gs, ptr, count, dtype, kind, name, ierr)
    type(gradsync_t), intent(in) :: gs
    type(c_ptr), intent(in) :: ptr
    integer(c_int64_t), intent(in) :: count
    integer, intent(in) :: dtype, kind
    character(len=*), intent(in) :: name
    integer, intent(out) :: ierr
    ierr = c_add(gs%h, ptr, count, int(dtype, c_int32_t), int(kind, c_int32_t), c_name(name))
  end subroutine

  !> Collective. done is .true. when the arrays hold synchronized values.
  subroutine gradsync_synchronize(gs, done, ierr)
    type(gradsync_t), intent(in) :: gs
    logical, intent(out) :: done
    integer, intent(out) :: ierr
    integer(c_int32_t) :: d
    ierr = c_synchronize(gs%h, d)
    done = d /= 0
  end subroutine

  subroutine gradsync_get_stats(gs, s, ierr)
    type(gradsync_t), intent(in) :: gs
    type(gradsync_stats), intent(out) :: s
    integer, intent(out) :: ierr
    ierr = c_get_stats(gs%h, s)
  end subroutine

  subroutine gradsync_size(gs, n, ierr)
    type(gradsync_t), intent(in) :: gs
    integer, intent(out) :: n, ierr
    integer(c_int32_t) :: v
    ierr = c_size(gs%h, v)
    n = v
  end subroutine

  subroutine gradsync_rank(gs, r, ierr)
    type(gradsync_t), intent(in) :: gs
    integer, intent(out) :: r, ierr
    integer(c_int32_t) :: v
    ierr = c_rank(gs%h, v)
    r = v
  end subroutine

  subroutine gradsync_destroy(gs, ierr)
    type(gradsync_t), intent(inout) :: gs
    integer, intent(out) :: ierr
    ierr = c_destroy(gs%h)
  end subroutine

  !> The message of the last failed call ("" if none).
  function gradsync_last_error() result(msg)
    character(len=:), allocatable :: msg
    type(c_ptr) :: p
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    p = c_last_error()
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: msg)
    do i = 1, n
      msg(i:i) = chars(i)
    end do
  end function

end module gradsync
