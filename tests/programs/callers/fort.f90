! The Fortran caller for the fidelity tests (`use mpi`), on 2 ranks: a
! Send/Recv and a Barrier, each alone on a line marked CALL:name, whose
! numbers the test reads here. Compiled with -g -O1.
program fort
  use mpi
  implicit none
  integer :: rank, ierr, buf(4), st(MPI_STATUS_SIZE)
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  buf = rank + 5
  if (rank == 0) then
    call MPI_Send(buf, 4, MPI_INTEGER, 1, 3, MPI_COMM_WORLD, ierr) ! CALL:send
  else
    call MPI_Recv(buf, 4, MPI_INTEGER, 0, 3, MPI_COMM_WORLD, st, ierr) ! CALL:recv
    if (buf(1) /= 5 .or. st(MPI_TAG) /= 3) call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end if
  call MPI_Barrier(MPI_COMM_WORLD, ierr) ! CALL:barrier
  print '(a,i0,a)', 'callers fortran rank=', rank, ' ok'
  call MPI_Finalize(ierr)
end program fort
