! Fortran calls reach the probes under their C names.
!
! usage: fortran GOFILE
! Every rank prints "READY <rank> <pid>", waits for GOFILE, then rank 0
! sends 10 integers one at a time to rank 1 with MPI_SEND (use mpi), and all
! ranks make 5 MPI_BARRIER calls; each prints "OK <rank>" when its results
! check out.
program fortran_calls
  use mpi
  implicit none
  integer :: rank, ierr, i, v, status(MPI_STATUS_SIZE)
  logical :: there
  character(len=256) :: go
  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
  call get_command_argument(1, go)
  write (*, '(A,I0,A,I0)') 'READY ', rank, ' ', getpid()
  flush (6)
  there = .false.
  do while (.not. there)
    inquire (file=trim(go), exist=there)
    if (.not. there) call sleep(1)
  end do
  do i = 1, 10
    if (rank == 0) then
      call MPI_SEND(i, 1, MPI_INTEGER, 1, 7, MPI_COMM_WORLD, ierr)
    else if (rank == 1) then
      call MPI_RECV(v, 1, MPI_INTEGER, 0, 7, MPI_COMM_WORLD, status, ierr)
      if (v /= i) call MPI_ABORT(MPI_COMM_WORLD, 3, ierr)
    end if
  end do
  do i = 1, 5
    call MPI_BARRIER(MPI_COMM_WORLD, ierr)
  end do
  write (*, '(A,I0)') 'OK ', rank
  flush (6)
  call MPI_FINALIZE(ierr)
end program fortran_calls
