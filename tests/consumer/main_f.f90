! The installed Fortran module: compiles, links, and reports an error code with its message (no MPI).
program consumer_f
  use gradsync
  implicit none
  type(gradsync_t) :: gs
  integer :: ierr
  call gradsync_create(gs, 0, ierr)
  if (ierr /= GRADSYNC_ERR_RUNTIME .or. index(gradsync_last_error(), "MPI is not initialized") == 0) then
    print '(a,i0,a,a)', "consumer_f: unexpected status ", ierr, ": ", gradsync_last_error()
    stop 1
  end if
  print '(a)', "consumer_f: ok"
end program
