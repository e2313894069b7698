! A small hybrid model trained from Fortran through gradsync's Fortran module, checking itself
! against the single-process model after every step.
!
! Model: a shared trunk h = tanh(W1 x + b1) (data-parallel: every rank holds it) and one scalar head
! y = v . h + c per rank (local: rank r owns head r and only its samples reach it). The global batch
! of B samples is split into n contiguous blocks; rank r trains on block r. The loss is the mean
! over the global batch, L = (1/n) sum_r L_r. gradsync averages the trunk's gradients and divides
! the heads' by n (GRADSYNC_LOCAL_SCALED): both are then exact gradients of L. Every rank also runs
! the single-process model (trunk plus all n heads, the whole batch) and compares after each SGD
! step. A float buffer carries the loss, averaged like a gradient, to show the second value type.
!
!   mpirun -n 3 ./fortran_hybrid        prints "check PASSED" or stops with code 1
!   mpirun -n 3 ./fortran_hybrid --head-scale none    the heads as GRADSYNC_LOCAL: must fail for n > 1
program fortran_hybrid
  use mpi
  use gradsync
  use, intrinsic :: iso_fortran_env, only: output_unit
  use, intrinsic :: iso_c_binding, only: c_loc, c_int64_t
  implicit none
  integer, parameter :: dp = kind(1.0d0), D = 4, H = 6, B = 12, STEPS = 15
  real(dp), parameter :: lr = 0.2_dp, tol = 1e-12_dp
  real(dp) :: x(D, B), t(B)
  ! distributed model (this rank's view) and its gradients
  real(dp), allocatable, target :: W1(:, :), b1(:), v(:), c(:), gW1(:, :), gb1(:), gv(:), gc(:)
  real(kind(1.0)), target :: loss_buf(1)
  ! single-process reference: trunk and all heads
  real(dp), allocatable :: rW1(:, :), rb1(:), rv(:, :), rc(:), rgW1(:, :), rgb1(:), rgv(:, :), rgc(:)
  type(gradsync_t) :: gs
  type(gradsync_stats) :: st
  integer :: ierr, rank, nranks, i, j, r, step, lo, hi, m
  logical :: done, loss_bad
  real(dp) :: err, worst, ref_loss, loss0, local_loss
  integer :: head_kind
  character(len=32) :: arg1, arg2

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  if (mod(B, nranks) /= 0) then
    if (rank == 0) print '(a,i0,a,i0,a)', "fortran_hybrid: the batch of ", B, " does not split over ", nranks, " ranks"
    call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end if
  m = B / nranks
  head_kind = GRADSYNC_LOCAL_SCALED
  call get_command_argument(1, arg1)
  call get_command_argument(2, arg2)
  if (arg1 == "--head-scale" .and. arg2 == "none") head_kind = GRADSYNC_LOCAL
  lo = rank * m + 1
  hi = lo + m - 1

  do j = 1, B
    do i = 1, D
      x(i, j) = sin(0.37_dp * i + 0.91_dp * j)
    end do
    t(j) = cos(0.5_dp * j)
  end do
  allocate(W1(H, D), b1(H), v(H), c(1), gW1(H, D), gb1(H), gv(H), gc(1))
  allocate(rW1(H, D), rb1(H), rv(H, nranks), rc(nranks), rgW1(H, D), rgb1(H), rgv(H, nranks), rgc(nranks))
  do j = 1, D
    do i = 1, H
      rW1(i, j) = 0.3_dp * sin(1.3_dp * i - 0.7_dp * j)
    end do
  end do
  do i = 1, H
    rb1(i) = 0.05_dp * i
    do r = 1, nranks
      rv(i, r) = 0.2_dp * cos(0.9_dp * i + 0.4_dp * r)
    end do
  end do
  do r = 1, nranks
    rc(r) = 0.1_dp * r
  end do
  W1 = rW1
  b1 = rb1
  v = rv(:, rank + 1)
  c(1) = rc(rank + 1)

  call gradsync_create(gs, MPI_COMM_WORLD, ierr)
  call check(ierr)
  call gradsync_add(gs, gW1, GRADSYNC_DATA_PARALLEL, "trunk.W1", ierr); call check(ierr)
  call gradsync_add(gs, gb1, GRADSYNC_DATA_PARALLEL, "trunk.b1", ierr); call check(ierr)
  call gradsync_add(gs, gv, head_kind, "head.v", ierr); call check(ierr)
  ! any contiguous array also goes by address and count (arrays of rank 3 and more)
  call gradsync_add_ptr(gs, c_loc(gc), size(gc, kind=c_int64_t), GRADSYNC_DOUBLE, head_kind, "head.c", ierr)
  call check(ierr)
  call gradsync_add(gs, loss_buf, GRADSYNC_DATA_PARALLEL, "loss", ierr); call check(ierr)

  worst = 0
  loss0 = -1
  loss_bad = .false.
  do step = 1, STEPS
    ! distributed: the gradient of this rank's mean loss
    gW1 = 0; gb1 = 0; gv = 0; gc = 0
    call accumulate(W1, b1, v, c(1), lo, hi, 1.0_dp / m, gW1, gb1, gv, gc(1), local_loss)
    loss_buf(1) = real(local_loss)
    call gradsync_synchronize(gs, done, ierr)
    call check(ierr)
    if (.not. done) stop 1
    W1 = W1 - lr * gW1; b1 = b1 - lr * gb1; v = v - lr * gv; c = c - lr * gc

    ! single process: the gradient of the global mean loss, every head
    rgW1 = 0; rgb1 = 0; rgv = 0; rgc = 0; ref_loss = 0
    do r = 1, nranks
      call accumulate(rW1, rb1, rv(:, r), rc(r), (r - 1) * m + 1, r * m, 1.0_dp / B, rgW1, rgb1, rgv(:, r), rgc(r), local_loss)
      ref_loss = ref_loss + local_loss
    end do
    rW1 = rW1 - lr * rgW1; rb1 = rb1 - lr * rgb1; rv = rv - lr * rgv; rc = rc - lr * rgc
    if (loss0 < 0) loss0 = ref_loss

    err = max(maxval(abs(W1 - rW1)), maxval(abs(b1 - rb1)), maxval(abs(v - rv(:, rank + 1))), abs(c(1) - rc(rank + 1)))
    worst = max(worst, err)
    ! the loss travelled as float: float tolerance
    if (abs(loss_buf(1) - ref_loss) > 1e-5_dp * max(1.0_dp, ref_loss)) then
      if (rank == 0) print '(a,i0,a,es12.5,a,es12.5)', "fortran_hybrid: step ", step, ": averaged loss ", loss_buf(1), &
           " differs from the single-process loss ", ref_loss
      loss_bad = .true.
    end if
  end do
  call MPI_Allreduce(MPI_IN_PLACE, worst, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ierr)
  call gradsync_get_stats(gs, st, ierr); call check(ierr)
  if (rank == 0) then
    print '(a,i0,a,i0,a,es10.3,a,es10.3,a,es10.3)', "fortran_hybrid: ", nranks, " ranks, ", STEPS, &
         " steps, loss ", loss0, " -> ", ref_loss, ", largest difference from the single-process model ", worst
    print '(a,i0,a,i0,a)', "fortran_hybrid: rank 0 allreduced ", st%bytes_allreduced, " bytes in ", st%allreduce_calls, " calls"
  end if
  ! the data-parallel bytes are the trunk (double) and the loss (float) every step; heads never travel
  if (nranks > 1 .and. st%bytes_allreduced /= int(STEPS * (8 * (H * D + H) + 4), kind(st%bytes_allreduced))) then
    if (rank == 0) print '(a)', "fortran_hybrid: unexpected bytes_allreduced"
    worst = 1
  end if
  if (.not. (ref_loss < loss0) .or. loss_bad) worst = 1
  call gradsync_destroy(gs, ierr); call check(ierr)
  ! the verdict is printed and flushed before the barrier: a rank that stops with 1 first must not let
  ! mpirun kill rank 0 before its line is out
  if (rank == 0) then
    if (worst > tol) then
      print '(a)', "fortran_hybrid: check FAILED"
    else
      print '(a)', "fortran_hybrid: check PASSED"
    end if
    flush(output_unit)
  end if
  call MPI_Barrier(MPI_COMM_WORLD, ierr)
  call MPI_Finalize(ierr)
  if (worst > tol) stop 1

contains

  subroutine check(status)
    integer, intent(in) :: status
    if (status /= GRADSYNC_OK) then
      print '(a,i0,a,i0,a,a)', "fortran_hybrid: rank ", rank, ": gradsync error ", status, ": ", gradsync_last_error()
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
    end if
  end subroutine

  ! Adds wt * gradient of sum_{j=j0..j1} 0.5 (y_j - t_j)^2 to the gradient arrays; loss gets wt * that sum.
  subroutine accumulate(W, bb, vv, cc, j0, j1, wt, dW, db, dv, dc, loss)
    real(dp), intent(in) :: W(H, D), bb(H), vv(H), cc, wt
    integer, intent(in) :: j0, j1
    real(dp), intent(inout) :: dW(H, D), db(H), dv(H), dc
    real(dp), intent(out) :: loss
    real(dp) :: hh(H), dz(H), e
    integer :: jj, k
    loss = 0
    do jj = j0, j1
      hh = tanh(matmul(W, x(:, jj)) + bb)
      e = dot_product(vv, hh) + cc - t(jj)
      loss = loss + wt * 0.5_dp * e * e
      dv = dv + wt * e * hh
      dc = dc + wt * e
      dz = wt * e * vv * (1 - hh * hh)
      db = db + dz
      do k = 1, D
        dW(:, k) = dW(:, k) + dz * x(k, jj)
      end do
    end do
  end subroutine

end program fortran_hybrid
