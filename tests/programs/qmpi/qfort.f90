! qprog.c in Fortran (`use mpi`), for tests/tests/e2e/qmpi.rs: on 2 ranks
! the same calls per rank as qprog.c without its options (3 MPI_Comm_rank,
! 1 MPI_Comm_size, 4 MPI_Send on rank 0 and as many MPI_Recv on rank 1,
! 3 MPI_Allreduce, 2 MPI_Barrier, 1 MPI_Finalize). It prints
! "READY <rank> <pid>" and, after checking every answer, "DONE <rank> ok".
program qfort
  use mpi
  implicit none
  integer :: rank, again, nranks, ierr, i, v, mine, total
  integer :: st(MPI_STATUS_SIZE)
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  if (nranks /= 2) call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  print '(a,i0,a,i0)', 'READY ', rank, ' ', getpid()
  do i = 0, 3
    if (rank == 0) then
      call MPI_Send(i, 1, MPI_INTEGER, 1, i, MPI_COMM_WORLD, ierr)
    else
      call MPI_Recv(v, 1, MPI_INTEGER, 0, i, MPI_COMM_WORLD, st, ierr)
      if (v /= i) call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
    end if
  end do
  do i = 0, 2
    mine = rank + 10 * i
    call MPI_Allreduce(mine, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (total /= 1 + 20 * i) call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end do
  do i = 1, 2
    call MPI_Comm_rank(MPI_COMM_WORLD, again, ierr)
    if (again /= rank) call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end do
  do i = 1, 2
    call MPI_Barrier(MPI_COMM_WORLD, ierr)
  end do
  print '(a,i0,a)', 'DONE ', rank, ' ok'
  call MPI_Finalize(ierr)
end program qfort
