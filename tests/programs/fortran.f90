! Fortran calls reach the probes under their C names.
!
! usage: fortran GOFILE
! Every rank prints "READY <rank> <pid>", waits for GOFILE, then rank 0
! sends 10 integers one at a time to rank 1 with MPI_SEND (use mpi), and all
! ranks make 5 MPI_BARRIER calls; each prints "OK <rank>" when its results
! check out. With FORTRAN_POLL set, the wait makes an MPI_IPROBE call every
! 2 ms, so a daemon can inject the shim at one of them (tests/tests/inject.rs).
program fortran_calls
  use mpi
  use iso_c_binding, only: c_int
  implicit none
  interface
    integer(c_int) function usleep(us) bind(C, name='usleep')
      import :: c_int
      integer(c_int), value :: us
    end function usleep
  end interface
  integer :: rank, ierr, i, v, status(MPI_STATUS_SIZE), n
  logical :: there, poll, flag
  character(len=256) :: go
  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
  call get_command_argument(1, go)
  write (*, '(A,I0,A,I0)') 'READY ', rank, ' ', getpid()
  flush (6)
  call get_environment_variable('FORTRAN_POLL', length=n)
  poll = n > 0
  there = .false.
  do while (.not. there)
    inquire (file=trim(go), exist=there)
    if (there) exit
    if (poll) then
      call MPI_IPROBE(MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, flag, status, ierr)
      n = usleep(2000)
    else
      call sleep(1)
    end if
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
