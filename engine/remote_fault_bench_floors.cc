#include "engine/remote_fault_bench_floors.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/clock.h"
#include "core/fd_io.h"
#include "core/page.h"
#include "core/unix_socket.h"
#include "engine/remote_fault_bench_common.h"
#include "testing/bench_samples.h"
#include "uffd/uffd_compat.h"

namespace stretch::engine::remote_fault_bench {
namespace {

using ::stretch::testing::Record;
using ::stretch::testing::RecordCpu;

char* SourcePage() {
  static char* page = [] {
    char* p = static_cast<char*>(aligned_alloc(kPageSize, kPageSize));
    memset(p, 0x42, kPageSize);
    return p;
  }();
  return page;
}

// The minimal handler: blocking read() of one message, UFFDIO_COPY of a page. Ends after
// serving a fault on `stop_page`.
void ServeUffd(int uffd, uintptr_t stop_page) {
  for (;;) {
    struct uffd_msg msg;
    if (read(uffd, &msg, sizeof(msg)) != sizeof(msg)) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return;
    }
    if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
    uint64_t page = msg.arg.pagefault.address & ~uint64_t{kPageSize - 1};
    struct uffdio_copy c = {page, reinterpret_cast<uintptr_t>(SourcePage()), kPageSize, 0, 0};
    ioctl(uffd, UFFDIO_COPY, &c);
    if (page == stop_page) return;
  }
}

// A blocking uffd over `pages` + 1 pages of `region` (the last one stops the handler).
int OpenBlockingUffd(char* region, size_t pages) {
  int uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC));
  if (uffd < 0) return -1;
  struct uffdio_api api = {UFFD_API, 0, 0};
  struct uffdio_register reg = {};
  reg.range.start = reinterpret_cast<uintptr_t>(region);
  reg.range.len = (pages + 1) * kPageSize;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  if (ioctl(uffd, UFFDIO_API, &api) != 0 || ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) {
    close(uffd);
    return -1;
  }
  return uffd;
}

// ChildUffd's commands to its child.
constexpr uint64_t kFault = 1, kStop = 2;

void SetParentDeathSignal() {
  // Only raw system calls from here on (the parent may have other threads).
  syscall(SYS_prctl, 1 /* PR_SET_PDEATHSIG */, SIGKILL, 0, 0, 0);
}

// The child of ChildUffd: sends its uffd and its stop page, then faults on command.
[[noreturn]] void ChildMain(int sock) {
  char* region =
      static_cast<char*>(mmap(nullptr, (kFloorPages + 1) * kPageSize, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  int uffd = region == MAP_FAILED ? -1 : OpenBlockingUffd(region, kFloorPages);
  if (uffd < 0) _exit(2);
  char byte = 0;
  struct iovec iov = {&byte, 1};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &uffd, sizeof(int));
  if (sendmsg(sock, &msg, 0) != 1) _exit(3);
  close(uffd);
  const uint64_t stop = reinterpret_cast<uintptr_t>(region) + kFloorPages * kPageSize;
  if (send(sock, &stop, sizeof stop, 0) != sizeof stop) _exit(4);
  int next = 0;
  for (;;) {
    uint64_t cmd;
    if (recv(sock, &cmd, sizeof cmd, 0) != sizeof cmd) _exit(0);
    int64_t ns = 0;
    if (cmd == kStop) {
      (void)*reinterpret_cast<volatile char*>(stop);
    } else {
      if (next == kFloorPages) {
        madvise(region, kFloorPages * kPageSize, MADV_DONTNEED);
        next = 0;
      }
      volatile char* p = region + (next++) * kPageSize;
      const int64_t t0 = NowNs();
      (void)*p;
      ns = NowNs() - t0;
    }
    if (send(sock, &ns, sizeof ns, 0) != sizeof ns) _exit(5);
  }
}

}  // namespace

InlineUffd::InlineUffd() {
  region_ = static_cast<char*>(mmap(nullptr, (kFloorPages + 1) * kPageSize, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (region_ == MAP_FAILED) Die("mmap for the uffd floor");
  uffd_ = OpenBlockingUffd(region_, kFloorPages);
  if (uffd_ < 0) Die(absl::StrCat("userfaultfd for the floor: ", strerror(errno)));
  const uintptr_t stop = reinterpret_cast<uintptr_t>(region_) + kFloorPages * kPageSize;
  thread_ = std::thread([this, stop] { ServeUffd(uffd_, stop); });  // inherits CPU 0
}

InlineUffd::~InlineUffd() {
  (void)*static_cast<volatile char*>(region_ + kFloorPages * kPageSize);
  thread_.join();
  close(uffd_);
  munmap(region_, (kFloorPages + 1) * kPageSize);
}

int64_t InlineUffd::FaultOnce() {
  if (next_ == kFloorPages) {
    madvise(region_, kFloorPages * kPageSize, MADV_DONTNEED);
    next_ = 0;
  }
  volatile char* p = region_ + (next_++) * kPageSize;
  const int64_t t0 = NowNs();
  (void)*p;
  return NowNs() - t0;
}

ChildUffd::ChildUffd() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) Die("socketpair");
  pid_ = fork();
  if (pid_ < 0) Die("fork");
  if (pid_ == 0) {
    close(sv[0]);
    SetParentDeathSignal();
    ChildMain(sv[1]);
  }
  close(sv[1]);
  sock_ = sv[0];
  auto got = ReceiveMessage(sock_, 1, absl::Now() + absl::Seconds(30));
  if (!got.ok() || !got->fd.valid()) Die("the floor's child sent no uffd");
  uffd_ = got->fd.release();
  uint64_t stop;
  if (recv(sock_, &stop, sizeof stop, 0) != sizeof stop) Die("floor child: stop page");
  thread_ = std::thread([this, stop] { ServeUffd(uffd_, stop); });
}

ChildUffd::~ChildUffd() {
  uint64_t cmd = kStop, reply;
  // The child's touch of the stop page ends the handler; if the child is gone, it never will.
  if (send(sock_, &cmd, sizeof cmd, MSG_NOSIGNAL) == sizeof cmd &&
      recv(sock_, &reply, sizeof reply, 0) == sizeof reply) {
    thread_.join();
  } else {
    thread_.detach();
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  close(sock_);
  close(uffd_);
}

int64_t ChildUffd::FaultOnce() {
  uint64_t cmd = kFault;
  int64_t ns;
  if (send(sock_, &cmd, sizeof cmd, MSG_NOSIGNAL) != sizeof cmd ||
      recv(sock_, &ns, sizeof ns, 0) != sizeof ns) {
    Die("floor child died");
  }
  return ns;
}

void FloorUffd(benchmark::State& state, InlineUffd* uffd) {
  const int64_t cpu = RunCpuNs();
  for (auto _ : state) Record(state, "uffd_copy", uffd->FaultOnce());
  RecordCpu("uffd_copy", RunCpuNs() - cpu, state.iterations());
}

void FloorUffdXproc(benchmark::State& state, ChildUffd* uffd) {
  for (auto _ : state) Record(state, "uffd_copy_xproc", uffd->FaultOnce());
}

void FloorTcp(benchmark::State& state, int fd, size_t request, std::string name) {
  std::vector<uint8_t> msg(request, 0), reply(kPageSize);
  const int64_t cpu = RunCpuNs();
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    if (!WriteFull(fd, msg.data(), msg.size()) || !ReadFull(fd, reply.data(), reply.size())) {
      Die("TCP floor ping-pong");
    }
    Record(state, name, NowNs() - t0);
  }
  RecordCpu(name, RunCpuNs() - cpu, state.iterations());
}

void TransportRtt(benchmark::State& state, transport::Transport* t, transport::PeerId peer,
                  size_t request, std::string name) {
  std::vector<uint8_t> msg(request, 0);
  const uint32_t reply = kPageSize;
  memcpy(msg.data(), &reply, sizeof reply);
  const int64_t cpu = RunCpuNs();
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    Check(t->Send(peer, msg), "transport Send");
    auto e = t->Receive(absl::Now() + kStep);
    if (!e.ok() || e->kind != transport::Event::Kind::kMessage || e->data.size() != kPageSize) {
      Die(absl::StrCat("transport round trip: ",
                       e.ok() ? "unexpected event" : e.status().ToString()));
    }
    Record(state, name, NowNs() - t0);
  }
  RecordCpu(name, RunCpuNs() - cpu, state.iterations());
}

// This thread sends, another thread (parked in Receive, like the agent's network thread)
// takes the reply and wakes this one (as the agent's UFFDIO_COPY wakes the faulting thread).
// Against transport_req_4k it shows what the two-thread pattern costs: the receiving thread
// woken by the send itself, both threads taking the transport's lock, one more wake-up.
void TransportXthread(benchmark::State& state, transport::Transport* t, transport::PeerId peer) {
  std::vector<uint8_t> msg(kRequestSize, 0);
  const uint32_t reply = kPageSize;
  memcpy(msg.data(), &reply, sizeof reply);
  std::atomic<uint32_t> replies{0};
  std::atomic<bool> stop{false};
  std::thread receiver([&] {  // inherits CPU 0 (and SCHED_FIFO with --realtime)
    while (!stop.load()) {
      auto e = t->Receive(absl::Now() + absl::Milliseconds(50));
      if (!e.ok()) continue;
      if (e->kind != transport::Event::Kind::kMessage || e->data.size() != kPageSize) continue;
      replies.fetch_add(1);
      replies.notify_one();
    }
  });
  uint32_t seen = 0;
  const int64_t cpu = RunCpuNs();
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    Check(t->Send(peer, msg), "transport Send");
    replies.wait(seen);
    seen = replies.load();
    Record(state, "transport_req_4k_xthread", NowNs() - t0);
  }
  RecordCpu("transport_req_4k_xthread", RunCpuNs() - cpu, state.iterations());
  stop.store(true);
  receiver.join();
}

}  // namespace stretch::engine::remote_fault_bench
