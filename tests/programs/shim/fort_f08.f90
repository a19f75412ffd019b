! `use mpi_f08`: rank 0 sends three messages to rank 1.
program fort_f08
  use mpi_f08
  implicit none
  integer :: rank, i, buf(4)
  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  buf = rank
  do i = 1, 3
    if (rank == 0) then
      call MPI_Send(buf, 4, MPI_INTEGER, 1, i, MPI_COMM_WORLD)
    else if (rank == 1) then
      call MPI_Recv(buf, 4, MPI_INTEGER, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE)
    end if
  end do
  ! MPI_Wtick returns a double through the shim's Fortran entry point.
  print '(a,i0,a,i0,a,l1)', 'shimtest fortran rank=', rank, ' buf=', buf(1), &
    ' tick_ok=', MPI_Wtick() > 0d0 .and. MPI_Wtick() < 1d0
  call MPI_Finalize()
end program fort_f08
