// A test program for the DSM engine: attaches a shared region through the local node agent
// and runs one sharing pattern against the other nodes' copies of itself, synchronising
// through the shared memory alone (atomics and spinning, no other channel). Prints results
// that the tests check against a sequential model.
//
//   dsm_prog --socket=PATH --node=I --nodes=N --mode=MODE [--iters=K] [--pages=P] [--seed=S]
//            [--shared]   (a MAP_SHARED region, as manual mode's)
//
// Modes: counter (atomic increments of one word), falseshare (each node its own word of one
// page), pingpong (two nodes alternate on one page), pages (each node fills its pages, all
// read all), scan (node 0 fills every page, the others read them in order), stress (random atomic
// increments and reads of P counters with a stale-read check).
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/attach_client.h"

namespace {

constexpr uintptr_t kBase = 0x7e0000000000;
constexpr size_t kPage = 4096;
constexpr int kDataPage0 = 16;

struct Barrier {
  uint64_t count;
  uint64_t generation;
};

char* g_mem;
int g_node, g_nodes;

void WaitBarrier() {
  auto* b = reinterpret_cast<Barrier*>(g_mem);
  uint64_t gen = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == static_cast<uint64_t>(g_nodes)) {
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->generation, gen + 1, __ATOMIC_RELEASE);
  } else {
    long spins = 0;
    while (__atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) == gen) {
      sched_yield();
      // A stuck barrier is a coherence bug: say what this node sees, once.
      if (++spins == 20'000'000) {
        fprintf(stderr,
                "dsm_prog: node %d stuck in barrier: count %lu generation %lu (entered at %lu)\n",
                g_node, static_cast<unsigned long>(b->count),
                static_cast<unsigned long>(b->generation), static_cast<unsigned long>(gen));
      }
    }
  }
}

uint64_t* Word(int page, int index) {
  return reinterpret_cast<uint64_t*>(g_mem + page * kPage) + index;
}

uint8_t Fill(int page, int byte) { return static_cast<uint8_t>(page * 31 + byte * 7 + 1); }

}  // namespace

int main(int argc, char** argv) {
  std::string socket, mode;
  bool shared = false;  // MAP_SHARED region (stretch_attach_shared)
  long iters = 1000, pages = 64, seed = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* p) { return a.substr(strlen(p)); };
    if (a.rfind("--socket=", 0) == 0)
      socket = val("--socket=");
    else if (a.rfind("--node=", 0) == 0)
      g_node = atoi(val("--node=").c_str());
    else if (a.rfind("--nodes=", 0) == 0)
      g_nodes = atoi(val("--nodes=").c_str());
    else if (a.rfind("--mode=", 0) == 0)
      mode = val("--mode=");
    else if (a.rfind("--iters=", 0) == 0)
      iters = atol(val("--iters=").c_str());
    else if (a.rfind("--pages=", 0) == 0)
      pages = atol(val("--pages=").c_str());
    else if (a.rfind("--seed=", 0) == 0)
      seed = atol(val("--seed=").c_str());
    else if (a == "--shared")
      shared = true;
    else {
      fprintf(stderr, "dsm_prog: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (socket.empty() || g_nodes < 1 || g_node < 0 || g_node >= g_nodes || mode.empty()) {
    fprintf(stderr, "usage: dsm_prog --socket=PATH --node=I --nodes=N --mode=MODE\n");
    return 2;
  }
  char err[512];
  size_t length = (kDataPage0 + pages) * kPage;
  auto attach = shared ? stretch_attach_shared : stretch_attach;
  if (attach(socket.c_str(), 1, reinterpret_cast<void*>(kBase), length, err, sizeof(err)) != 0) {
    fprintf(stderr, "dsm_prog: %s\n", err);
    return 3;
  }
  g_mem = reinterpret_cast<char*>(kBase);
  WaitBarrier();  // everyone attached

  int bad = 0;
  if (mode == "counter") {
    for (long i = 0; i < iters; ++i) __atomic_fetch_add(Word(1, 0), 1, __ATOMIC_SEQ_CST);
    WaitBarrier();
    if (g_node == 0) printf("counter %lu\n", static_cast<unsigned long>(*Word(1, 0)));
  } else if (mode == "falseshare") {
    volatile uint64_t* mine = Word(2, g_node);
    for (long i = 0; i < iters; ++i) *mine = *mine + 1;
    WaitBarrier();
    if (g_node == 0) {
      printf("slots");
      for (int n = 0; n < g_nodes; ++n) printf(" %lu", static_cast<unsigned long>(*Word(2, n)));
      printf("\n");
    }
  } else if (mode == "pingpong") {
    volatile uint64_t* turn = Word(3, 0);
    volatile uint64_t* data = Word(3, 1);
    for (long i = 0; i < iters; ++i) {
      while (static_cast<int>(*turn % g_nodes) != g_node) sched_yield();
      *data = *data + 1;
      __atomic_store_n(turn, *turn + 1, __ATOMIC_SEQ_CST);
    }
    WaitBarrier();
    if (g_node == 0) printf("pingpong %lu\n", static_cast<unsigned long>(*data));
  } else if (mode == "pages") {
    for (long p = g_node; p < pages; p += g_nodes) {
      char* page = g_mem + (kDataPage0 + p) * kPage;
      for (size_t b = 0; b < kPage; ++b) page[b] = static_cast<char>(Fill(p, b));
    }
    WaitBarrier();
    for (long p = 0; p < pages; ++p) {
      const char* page = g_mem + (kDataPage0 + p) * kPage;
      for (size_t b = 0; b < kPage; ++b) bad += page[b] != static_cast<char>(Fill(p, b));
    }
    printf("node %d pages %ld bad %d\n", g_node, pages, bad);
  } else if (mode == "scan") {
    if (g_node == 0) {
      for (long p = 0; p < pages; ++p) {
        char* page = g_mem + (kDataPage0 + p) * kPage;
        for (size_t b = 0; b < kPage; ++b) page[b] = static_cast<char>(Fill(p, b));
      }
    }
    WaitBarrier();
    if (g_node != 0) {
      for (long p = 0; p < pages; ++p) {
        const char* page = g_mem + (kDataPage0 + p) * kPage;
        for (size_t b = 0; b < kPage; ++b) bad += page[b] != static_cast<char>(Fill(p, b));
      }
    }
    printf("node %d scan %ld bad %d\n", g_node, pages, bad);
  } else if (mode == "gather") {
    // The others write the pages; node 0 says "waiting" and reads them once it gets SIGUSR1
    // (after the test had its agent gather them: NodeAgent::GatherPages).
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, nullptr);
    if (g_node != 0) {
      for (long p = 0; p < pages; ++p) {
        if (p % (g_nodes - 1) != g_node - 1) continue;
        char* page = g_mem + (kDataPage0 + p) * kPage;
        for (size_t b = 0; b < kPage; ++b) page[b] = static_cast<char>(Fill(p, b));
      }
    }
    WaitBarrier();
    if (g_node == 0) {
      printf("node 0 waiting\n");
      fflush(stdout);
      int sig = 0;
      sigwait(&usr1, &sig);
      for (long p = 0; p < pages; ++p) {
        const char* page = g_mem + (kDataPage0 + p) * kPage;
        for (size_t b = 0; b < kPage; ++b) bad += page[b] != static_cast<char>(Fill(p, b));
      }
      printf("node 0 gather %ld bad %d\n", pages, bad);
    }
  } else if (mode == "stress") {
    // Page kDataPage0+p holds counter p, only ever incremented: no node may see it go back.
    std::mt19937_64 rng(seed * 1000 + g_node);
    std::vector<uint64_t> seen(pages, 0);
    uint64_t increments = 0, stale = 0;
    for (long i = 0; i < iters; ++i) {
      long p = rng() % pages;
      uint64_t* c = Word(kDataPage0 + p, 0);
      uint64_t v;
      if (rng() & 1) {
        v = __atomic_fetch_add(c, 1, __ATOMIC_SEQ_CST);
        ++increments;
        if (v < seen[p]) ++stale;
        seen[p] = v + 1;
      } else {
        v = __atomic_load_n(c, __ATOMIC_SEQ_CST);
        if (v < seen[p]) ++stale;
        seen[p] = v;
      }
    }
    *Word(2, g_node) = increments;
    WaitBarrier();
    if (g_node == 0) {
      uint64_t total = 0, reported = 0;
      for (long p = 0; p < pages; ++p) total += *Word(kDataPage0 + p, 0);
      for (int n = 0; n < g_nodes; ++n) reported += *Word(2, n);
      printf("stress total %lu increments %lu\n", static_cast<unsigned long>(total),
             static_cast<unsigned long>(reported));
      bad = total != reported;
    }
    printf("node %d stale %lu\n", g_node, static_cast<unsigned long>(stale));
    bad += stale != 0;
  } else if (mode == "hold") {
    // Attach, then write a shared word forever (for tests that kill agents).
    printf("node %d holding\n", g_node);
    fflush(stdout);
    for (;;) {
      __atomic_fetch_add(Word(1, 0), 1, __ATOMIC_SEQ_CST);
      usleep(1000);
    }
  } else {
    fprintf(stderr, "dsm_prog: unknown mode %s\n", mode.c_str());
    return 2;
  }
  fflush(stdout);
  // Node 0 has read everything it needs before this barrier; nobody leaves earlier.
  WaitBarrier();
  // Give our copies back so the others can finish the barrier after we are gone.
  if (stretch_detach(socket.c_str(), 1, err, sizeof(err)) != 0) {
    fprintf(stderr, "dsm_prog: %s\n", err);
    return 4;
  }
  return bad ? 1 : 0;
}
