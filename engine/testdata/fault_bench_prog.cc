// fault_bench_prog: the faulting process of one node in //engine:remote_fault_benchmark.
// Attaches the benchmark region through its node agent (attach_client.h), then serves the
// driver's commands (fault_bench_protocol.h) on a Unix socket: put pages in a state by
// touching them (untimed), touch one page and report how long that access took, or run an
// ownership ping-pong on one page with another node's copy of this program.
//
//   fault_bench_prog --socket=AGENT_SOCKET --control=PATH --pages=N
//
// Prints "READY" on stdout once attached and listening. Single-threaded.
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/clock.h"
#include "engine/attach_client.h"
#include "engine/testdata/fault_bench_protocol.h"

namespace {

using stretch::engine::fault_bench::Command;
using stretch::engine::fault_bench::kMaxSamples;
using stretch::engine::fault_bench::kRegionBase;
using stretch::engine::fault_bench::kRegionId;
using stretch::engine::fault_bench::Op;
using stretch::engine::fault_bench::Reply;
using stretch::NowNs;

constexpr size_t kPage = 4096;
// A ping-pong whose peer does not move for this long gives up.
constexpr int64_t kPingPongTimeoutNs = 20'000'000'000;

uint64_t g_pages;

volatile uint64_t* Word(uint64_t page) {
  return reinterpret_cast<volatile uint64_t*>(kRegionBase + page * kPage);
}

bool InRange(uint64_t page, uint64_t count) { return page < g_pages && count <= g_pages - page; }

// Fills `r` for `c`; returns false to exit after replying.
bool Serve(const Command& c, Reply& r) {
  r.error = 0;
  r.count = 0;
  r.value = 0;
  if (!InRange(c.page, c.op == Op::kRead || c.op == Op::kWrite ? c.count : 1)) {
    fprintf(stderr, "fault_bench_prog: page %lu (+%u) outside the region\n",
            static_cast<unsigned long>(c.page), c.count);
    r.error = 1;
    return true;
  }
  switch (c.op) {
    case Op::kRead: {
      uint64_t x = 0;
      for (uint32_t i = 0; i < c.count; ++i) x ^= *Word(c.page + i);
      r.value = x;
      return true;
    }
    case Op::kWrite:
      for (uint32_t i = 0; i < c.count; ++i) *Word(c.page + i) = c.value + i;
      return true;
    case Op::kTimedRead: {
      volatile uint64_t* w = Word(c.page);
      const int64_t t0 = NowNs();
      const uint64_t v = *w;
      const int64_t t1 = NowNs();
      r.value = v;
      r.ns[0] = t1 - t0;
      r.count = 1;
      return true;
    }
    case Op::kTimedWrite: {
      volatile uint64_t* w = Word(c.page);
      const int64_t t0 = NowNs();
      *w = c.value;
      const int64_t t1 = NowNs();
      r.ns[0] = t1 - t0;
      r.count = 1;
      return true;
    }
    case Op::kPingPong: {
      if (c.count < 2 || c.count > kMaxSamples + 1) {
        r.error = 2;
        return true;
      }
      uint64_t* turn = reinterpret_cast<uint64_t*>(kRegionBase + c.page * kPage);
      int64_t last = 0;
      for (uint32_t i = 0; i < c.count; ++i) {
        const int64_t start = NowNs();
        for (uint32_t tries = 0;; ++tries) {
          uint64_t expected = c.me;
          // lock cmpxchg is a write access whether or not it succeeds: the page comes in M.
          if (__atomic_compare_exchange_n(turn, &expected, c.other, false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST)) {
            break;
          }
          // Let this CPU's agent threads run: they must hand the page over.
          sched_yield();
          if ((tries & 1023) == 1023 && NowNs() - start > kPingPongTimeoutNs) {
            fprintf(stderr, "fault_bench_prog: ping-pong stuck at round %u (word %lu)\n", i,
                    static_cast<unsigned long>(expected));
            r.error = 3;
            return true;
          }
        }
        const int64_t now = NowNs();
        if (i > 0) r.ns[r.count++] = now - last;
        last = now;
      }
      return true;
    }
    case Op::kQuit:
      return false;
  }
  r.error = 4;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string agent_socket, control;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--socket=", 0) == 0) {
      agent_socket = a.substr(9);
    } else if (a.rfind("--control=", 0) == 0) {
      control = a.substr(10);
    } else if (a.rfind("--pages=", 0) == 0) {
      g_pages = strtoull(a.c_str() + 8, nullptr, 10);
    } else {
      fprintf(stderr, "fault_bench_prog: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (agent_socket.empty() || control.empty() || g_pages == 0) {
    fprintf(stderr, "usage: fault_bench_prog --socket=AGENT_SOCKET --control=PATH --pages=N\n");
    return 2;
  }
  int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (listener < 0 || control.size() >= sizeof(addr.sun_path)) {
    fprintf(stderr, "fault_bench_prog: control socket %s: %s\n", control.c_str(),
            listener < 0 ? strerror(errno) : "path too long");
    return 3;
  }
  memcpy(addr.sun_path, control.c_str(), control.size() + 1);
  unlink(control.c_str());
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0) {
    fprintf(stderr, "fault_bench_prog: bind %s: %s\n", control.c_str(), strerror(errno));
    return 3;
  }
  char err[512];
  if (stretch_attach(agent_socket.c_str(), kRegionId, reinterpret_cast<void*>(kRegionBase),
                     g_pages * kPage, err, sizeof(err)) != 0) {
    fprintf(stderr, "fault_bench_prog: %s\n", err);
    return 4;
  }
  printf("READY\n");
  fflush(stdout);
  int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (conn < 0) {
    fprintf(stderr, "fault_bench_prog: accept: %s\n", strerror(errno));
    return 5;
  }
  close(listener);
  unlink(control.c_str());
  static Reply reply;
  for (;;) {
    Command c;
    ssize_t n = recv(conn, &c, sizeof(c), 0);
    if (n == 0) return 0;  // the driver went away
    if (n != static_cast<ssize_t>(sizeof(c))) {
      fprintf(stderr, "fault_bench_prog: short command (%zd bytes)\n", n);
      return 6;
    }
    const bool more = Serve(c, reply);
    const size_t len = offsetof(Reply, ns) + reply.count * sizeof(reply.ns[0]);
    if (send(conn, &reply, len, MSG_NOSIGNAL) != static_cast<ssize_t>(len)) return 7;
    if (!more) return 0;
  }
}
