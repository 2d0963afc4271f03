/* Synchronization torture: every pthread and process facility a transparent DSM must keep
 * working across nodes, one test per --test=NAME, each printing a deterministic result.
 *
 *   mutex condvar barrier sem atomic join detach malloc mmap remap spawn affinity signal
 *   (all: each; a comma-separated list runs those, in the order above)
 *   exit   a non-main thread calls exit(42) while others are blocked
 *   abort  a non-main thread calls abort() (killed by SIGABRT)
 *
 * --threads=N (default 4), --rounds=R (default 2000). Exit status 0 unless a check fails (1)
 * or the test is exit/abort.
 * --start_gate_ms=M: workers created together wait (spinning, no futex) until main has waited
 * M ms in a timed condition wait, so that all of them are alive at a migration point taken
 * while they are created (e.g. stretchd run --migrate_at_threads=THREADS+1). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define MAX_THREADS 64

static int g_threads = 4;
static long g_rounds = 2000;
static long g_start_gate_ms = 0;
static int g_failed = 0;

#define CHECK(cond, ...)                    \
  do {                                      \
    if (!(cond)) {                          \
      printf("CHECK FAILED: " __VA_ARGS__); \
      printf("\n");                         \
      g_failed = 1;                         \
    }                                       \
  } while (0)

typedef void* (*thread_fn)(void*);

/* Workers started by run_threads, held at the start gate. */
static struct {
  thread_fn fn;
  void* arg;
} g_start[MAX_THREADS];
static int g_gate_open;

static void* gated_start(void* p) {
  long i = (long)p;
  while (!__atomic_load_n(&g_gate_open, __ATOMIC_ACQUIRE)) sched_yield();
  return g_start[i].fn(g_start[i].arg);
}

/* Main waits --start_gate_ms in a timed condition wait (a futex), then opens the gate. */
static void open_gate_after_wait(void) {
  wl_timed_wait_ms(g_start_gate_ms);
  __atomic_store_n(&g_gate_open, 1, __ATOMIC_RELEASE);
}

/* Runs fns[i](args[i]) in n threads started together (behind the start gate), joins them. */
static void run_each(int n, const thread_fn* fns, void* const* args, void** results) {
  pthread_t t[MAX_THREADS];
  __atomic_store_n(&g_gate_open, g_start_gate_ms == 0, __ATOMIC_RELEASE);
  for (int i = 0; i < n; ++i) {
    g_start[i].fn = fns[i];
    g_start[i].arg = args[i];
    int err = pthread_create(&t[i], NULL, gated_start, (void*)(long)i);
    if (err) {
      fprintf(stderr, "pthread_create: %s\n", strerror(err));
      exit(1);
    }
  }
  if (g_start_gate_ms > 0) open_gate_after_wait();
  for (int i = 0; i < n; ++i) pthread_join(t[i], results ? &results[i] : NULL);
}

static void run_threads(int n, thread_fn fn, void* args, size_t arg_size, void** results) {
  thread_fn fns[MAX_THREADS];
  void* a[MAX_THREADS];
  for (int i = 0; i < n; ++i) {
    fns[i] = fn;
    a[i] = (char*)args + i * arg_size;
  }
  run_each(n, fns, a, results);
}

/* ---- mutex: a shared counter under one lock, and per-thread counters. */
static pthread_mutex_t m_lock = PTHREAD_MUTEX_INITIALIZER;
static long m_counter;
static void* mutex_worker(void* p) {
  long* mine = p;
  for (long r = 0; r < g_rounds; ++r) {
    pthread_mutex_lock(&m_lock);
    m_counter++;
    pthread_mutex_unlock(&m_lock);
    (*mine)++;
  }
  return NULL;
}
static void test_mutex(void) {
  long mine[MAX_THREADS] = {0};
  m_counter = 0;
  run_threads(g_threads, mutex_worker, mine, sizeof(long), NULL);
  long sum = 0;
  for (int i = 0; i < g_threads; ++i) sum += mine[i];
  CHECK(m_counter == g_threads * g_rounds, "mutex counter %ld", m_counter);
  printf("mutex: counter=%ld per_thread_sum=%ld\n", m_counter, sum);
}

/* ---- condvar: a bounded buffer with producers and consumers. */
#define QCAP 8
static struct {
  pthread_mutex_t mu;
  pthread_cond_t not_full, not_empty;
  long buf[QCAP];
  int head, count, producers_left;
} q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};
typedef struct {
  int id, producer;
  long sum, items;
} qarg;
static void* queue_worker(void* p) {
  qarg* a = p;
  if (a->producer) {
    for (long r = 1; r <= g_rounds; ++r) {
      pthread_mutex_lock(&q.mu);
      while (q.count == QCAP) pthread_cond_wait(&q.not_full, &q.mu);
      q.buf[(q.head + q.count++) % QCAP] = r * 1000 + a->id;
      pthread_cond_signal(&q.not_empty);
      pthread_mutex_unlock(&q.mu);
    }
    pthread_mutex_lock(&q.mu);
    q.producers_left--;
    pthread_cond_broadcast(&q.not_empty);
    pthread_mutex_unlock(&q.mu);
  } else {
    for (;;) {
      pthread_mutex_lock(&q.mu);
      while (q.count == 0 && q.producers_left > 0) pthread_cond_wait(&q.not_empty, &q.mu);
      if (q.count == 0) {
        pthread_mutex_unlock(&q.mu);
        break;
      }
      long v = q.buf[q.head];
      q.head = (q.head + 1) % QCAP;
      q.count--;
      pthread_cond_signal(&q.not_full);
      pthread_mutex_unlock(&q.mu);
      a->sum += v;
      a->items++;
    }
  }
  return NULL;
}
static void test_condvar(void) {
  int n = g_threads < 2 ? 2 : g_threads;
  int producers = n / 2;
  qarg args[MAX_THREADS] = {{0}};
  q.head = q.count = 0;
  q.producers_left = producers;
  for (int i = 0; i < n; ++i) args[i] = (qarg){i, i < producers, 0, 0};
  run_threads(n, queue_worker, args, sizeof(qarg), NULL);
  long sum = 0, items = 0;
  for (int i = producers; i < n; ++i) {
    sum += args[i].sum;
    items += args[i].items;
  }
  long want = 0;
  for (int p = 0; p < producers; ++p) want += 1000 * g_rounds * (g_rounds + 1) / 2 + p * g_rounds;
  CHECK(sum == want && items == producers * g_rounds, "condvar sum %ld want %ld", sum, want);
  printf("condvar: items=%ld sum=%ld\n", items, sum);
}

/* ---- barrier: phases in which every thread reads what all wrote in the previous phase. */
static pthread_barrier_t b_barrier;
static long b_slot[MAX_THREADS];
static void* barrier_worker(void* p) {
  long id = *(long*)p, acc = 0;
  long phases = g_rounds / 10 + 1;
  for (long ph = 1; ph <= phases; ++ph) {
    b_slot[id] = ph * (id + 1);
    pthread_barrier_wait(&b_barrier);
    for (int i = 0; i < g_threads; ++i) acc += b_slot[i];
    pthread_barrier_wait(&b_barrier);
  }
  *(long*)p = acc;
  return NULL;
}
static void test_barrier(void) {
  long args[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) args[i] = i;
  pthread_barrier_init(&b_barrier, NULL, (unsigned)g_threads);
  run_threads(g_threads, barrier_worker, args, sizeof(long), NULL);
  pthread_barrier_destroy(&b_barrier);
  long phases = g_rounds / 10 + 1, n = g_threads;
  long want = phases * (phases + 1) / 2 * (n * (n + 1) / 2);
  int ok = 1;
  for (int i = 0; i < g_threads; ++i) ok &= args[i] == want;
  CHECK(ok, "barrier accumulators differ from %ld", want);
  printf("barrier: phases=%ld each=%ld\n", phases, args[0]);
}

/* ---- semaphores: a token passed around a ring of threads. */
static sem_t s_sem[MAX_THREADS];
static long s_value;
static void* sem_worker(void* p) {
  long id = *(long*)p, rounds = g_rounds / 10 + 1;
  for (long r = 0; r < rounds; ++r) {
    sem_wait(&s_sem[id]);
    s_value = s_value * 3 + id;
    s_value %= 1000000007;
    sem_post(&s_sem[(id + 1) % g_threads]);
  }
  return NULL;
}
static void test_sem(void) {
  long args[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) {
    args[i] = i;
    sem_init(&s_sem[i], 0, i == 0);
  }
  s_value = 1;
  run_threads(g_threads, sem_worker, args, sizeof(long), NULL);
  long want = 1, rounds = g_rounds / 10 + 1;
  for (long r = 0; r < rounds; ++r) {
    for (int i = 0; i < g_threads; ++i) want = (want * 3 + i) % 1000000007;
  }
  CHECK(s_value == want, "sem value %ld want %ld", s_value, want);
  printf("sem: value=%ld\n", s_value);
  for (int i = 0; i < g_threads; ++i) sem_destroy(&s_sem[i]);
}

/* ---- atomics: fetch-add, and a spin-flag relay that uses no futex at all. */
static long a_counter;
static volatile int a_turn;
static void* atomic_worker(void* p) {
  long id = *(long*)p;
  for (long r = 0; r < g_rounds; ++r) __atomic_fetch_add(&a_counter, 1, __ATOMIC_SEQ_CST);
  long hops = g_rounds / 100 + 1;
  for (long h = 0; h < hops; ++h) {
    while (__atomic_load_n(&a_turn, __ATOMIC_ACQUIRE) % g_threads != id) sched_yield();
    __atomic_fetch_add(&a_turn, 1, __ATOMIC_RELEASE);
  }
  return NULL;
}
static void test_atomic(void) {
  long args[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) args[i] = i;
  a_counter = 0;
  a_turn = 0;
  run_threads(g_threads, atomic_worker, args, sizeof(long), NULL);
  long hops = g_rounds / 100 + 1;
  CHECK(a_counter == g_threads * g_rounds && a_turn == g_threads * hops, "atomic %ld %d", a_counter,
        a_turn);
  printf("atomic: counter=%ld relay=%d\n", a_counter, a_turn);
}

/* ---- join: values returned through pthread_join (the kernel's exit-time wake), in several
 * rounds: glibc hands a joined thread's stack, and the tid word in it, to the next thread
 * created, so a late store to the old thread's word would end the new one's join early. */
static void* join_worker(void* p) {
  long id = *(long*)p, acc = 0;
  for (long r = 0; r < g_rounds; ++r) acc += (r ^ id) & 7;
  return (void*)(acc * 100 + id);
}
static void test_join(void) {
  long args[MAX_THREADS];
  void* results[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) args[i] = i;
  long sum = 0;
  for (int round = 0; round < 10; ++round) {
    run_threads(g_threads, join_worker, args, sizeof(long), results);
    for (int i = 0; i < g_threads; ++i) {
      long acc = 0;
      for (long r = 0; r < g_rounds; ++r) acc += (r ^ i) & 7;
      CHECK((long)results[i] == acc * 100 + i, "join round %d thread %d returned %ld, not %ld",
            round, i, (long)results[i], acc * 100 + i);
      sum += (long)results[i];
    }
  }
  printf("join: sum=%ld\n", sum);
}

/* ---- detached threads report completion through a condition variable. */
static pthread_mutex_t d_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t d_cv = PTHREAD_COND_INITIALIZER;
static int d_done;
static long d_sum;
static void* detached_worker(void* p) {
  long id = (long)p, acc = 0;
  for (long r = 0; r < g_rounds; ++r) acc += r % (id + 2);
  pthread_mutex_lock(&d_mu);
  d_sum += acc;
  d_done++;
  pthread_cond_signal(&d_cv);
  pthread_mutex_unlock(&d_mu);
  return NULL;
}
static void test_detach(void) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  d_done = 0;
  d_sum = 0;
  for (long i = 0; i < g_threads; ++i) {
    pthread_t t;
    if (pthread_create(&t, &attr, detached_worker, (void*)i)) exit(1);
  }
  pthread_mutex_lock(&d_mu);
  while (d_done < g_threads) pthread_cond_wait(&d_cv, &d_mu);
  pthread_mutex_unlock(&d_mu);
  pthread_attr_destroy(&attr);
  printf("detach: done=%d sum=%ld\n", d_done, d_sum);
}

/* ---- malloc: blocks allocated in one thread and freed in another (arenas per thread). */
typedef struct {
  long id;
  unsigned char* blocks[64];
  unsigned long sum;
} marg;
static void* malloc_worker(void* p) {
  marg* a = p;
  for (int k = 0; k < 64; ++k) {
    size_t sz = 16 + (size_t)((a->id * 131 + k * 977) % 20000);
    a->blocks[k] = malloc(sz);
    for (size_t i = 0; i < sz; ++i) a->blocks[k][i] = (unsigned char)(i + k + a->id);
    a->sum += a->blocks[k][sz - 1] + sz;
  }
  return NULL;
}
static void* free_worker(void* p) {
  marg* a = p;
  for (int k = 0; k < 64; ++k) free(a->blocks[k]);
  return NULL;
}
static void test_malloc(void) {
  marg args[MAX_THREADS];
  memset(args, 0, sizeof(args));
  for (int i = 0; i < g_threads; ++i) args[i].id = i;
  run_threads(g_threads, malloc_worker, args, sizeof(marg), NULL);
  unsigned long sum = 0;
  for (int i = 0; i < g_threads; ++i) sum += args[i].sum;
  /* Free each thread's blocks from a different thread. */
  marg shifted[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) shifted[i] = args[(i + 1) % g_threads];
  run_threads(g_threads, free_worker, shifted, sizeof(marg), NULL);
  printf("malloc: sum=%lu\n", sum);
}

/* ---- mmap: regions mapped by one thread and used, protected, grown and unmapped by others. */
static pthread_mutex_t mm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mm_cv = PTHREAD_COND_INITIALIZER;
static unsigned char *mm_a, *mm_b;
static int mm_stage;
#define PG 4096
static void mm_die(const char* what) {
  perror(what);
  exit(1);
}
static void mm_set_stage(int s) {
  pthread_mutex_lock(&mm_mu);
  mm_stage = s;
  pthread_cond_broadcast(&mm_cv);
  pthread_mutex_unlock(&mm_mu);
}
static void mm_wait_stage(int s) {
  pthread_mutex_lock(&mm_mu);
  while (mm_stage < s) pthread_cond_wait(&mm_cv, &mm_mu);
  pthread_mutex_unlock(&mm_mu);
}
static void* mmap_maker(void* p) {
  (void)p;
  int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
  unsigned char* a = mmap(NULL, 64 * PG, prot, flags, -1, 0);
  unsigned char* b = mmap(NULL, 16 * PG, prot, flags, -1, 0);
  if (a == MAP_FAILED || b == MAP_FAILED) mm_die("mmap");
  for (int i = 0; i < 64 * PG; ++i) a[i] = (unsigned char)(i * 7);
  for (int i = 0; i < 16 * PG; ++i) b[i] = (unsigned char)(i * 5);
  mm_a = a;
  mm_b = b;
  mm_set_stage(1);
  mm_wait_stage(2);
  /* Grow b (it may move), fill the new part, and drop its first 8 pages. */
  unsigned char* g = mremap(b, 16 * PG, 48 * PG, MREMAP_MAYMOVE);
  if (g == MAP_FAILED) mm_die("mremap");
  for (int i = 16 * PG; i < 48 * PG; ++i) g[i] = (unsigned char)(i * 3);
  if (munmap(g, 8 * PG) != 0) mm_die("munmap");
  mm_b = g;
  mm_set_stage(3);
  return NULL;
}
static void* mmap_user(void* p) {
  unsigned long* out = p;
  mm_wait_stage(1);
  unsigned long s = 0;
  for (int i = 0; i < 64 * PG; ++i) s += mm_a[i];
  for (int i = 0; i < 16 * PG; ++i) s += mm_b[i];
  if (mprotect(mm_a + 48 * PG, 16 * PG, PROT_READ) != 0) mm_die("mprotect");
  mm_set_stage(2);
  mm_wait_stage(3);
  for (int i = 8 * PG; i < 48 * PG; ++i) s += mm_b[i];
  for (int i = 0; i < 64 * PG; ++i) s += mm_a[i];
  *out = s;
  return NULL;
}
static void test_mmap(void) {
  mm_stage = 0;
  unsigned long sum = 0;
  const thread_fn fns[2] = {mmap_maker, mmap_user};
  void* const args[2] = {NULL, &sum};
  run_each(2, fns, args, NULL);
  munmap(mm_a, 64 * PG);
  munmap(mm_b + 8 * PG, 40 * PG);
  printf("mmap: sum=%lu\n", sum);
}

/* ---- remap: memory unmapped (munmap, brk shrinking) by one thread reads as zeros when mapped
 * again by another, whatever it held before. */
static unsigned long rm_sum(const unsigned char* p, size_t n) {
  unsigned long s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}
static unsigned long rm_results[4];
static void* remap_maker(void* arg) {
  (void)arg;
  unsigned char* p =
      mmap(NULL, 32 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) mm_die("mmap");
  memset(p, 0xab, 32 * PG);
  mm_a = p;
  mm_set_stage(1);
  mm_wait_stage(2); /* the user unmapped the first half */
  unsigned char* q =
      mmap(p, 16 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (q != p) mm_die("mmap(MAP_FIXED)");
  rm_results[1] = rm_sum(q, 16 * PG); /* 0 */
  memset(q, 0x11, 16 * PG);
  mm_set_stage(3);
  mm_wait_stage(4); /* the user grew and shrank the heap */
  unsigned char* b = sbrk(16 * PG);
  if (b == (void*)-1) mm_die("sbrk");
  rm_results[3] = rm_sum(b, 16 * PG); /* 0, not what the user wrote there */
  if (sbrk(-16 * PG) == (void*)-1) mm_die("sbrk");
  return NULL;
}
static void* remap_user(void* arg) {
  (void)arg;
  mm_wait_stage(1);
  rm_results[0] = rm_sum(mm_a, 32 * PG);
  if (munmap(mm_a, 16 * PG) != 0) mm_die("munmap");
  mm_set_stage(2);
  mm_wait_stage(3);
  rm_results[2] = rm_sum(mm_a, 32 * PG);
  unsigned char* b = sbrk(16 * PG);
  if (b == (void*)-1) mm_die("sbrk");
  memset(b, 0xcd, 16 * PG);
  if (sbrk(-16 * PG) == (void*)-1) mm_die("sbrk");
  mm_set_stage(4);
  return NULL;
}
static void test_remap(void) {
  mm_stage = 0;
  const thread_fn fns[2] = {remap_maker, remap_user};
  void* const args[2] = {NULL, NULL};
  run_each(2, fns, args, NULL);
  munmap(mm_a, 32 * PG);
  printf("remap: first=%lu zeroed=%lu second=%lu brk_zeroed=%lu\n", rm_results[0], rm_results[1],
         rm_results[2], rm_results[3]);
  CHECK(rm_results[1] == 0 && rm_results[3] == 0, "memory mapped again was not zeros");
}

/* ---- spawn: every worker creates and joins threads of its own (wherever it runs). */
static long sp_results[MAX_THREADS * 3];
static void* spawn_child(void* p) {
  long i = (long)p, s = 0;
  for (long k = 0; k < g_rounds * 100; ++k) s += (k ^ i) & 7;
  sp_results[i] = s;
  return NULL;
}
static void* spawn_worker(void* p) {
  long id = *(long*)p;
  pthread_t t[3];
  for (long j = 0; j < 3; ++j) {
    int err = pthread_create(&t[j], NULL, spawn_child, (void*)(id * 3 + j));
    if (err) {
      fprintf(stderr, "pthread_create: %s\n", strerror(err));
      exit(1);
    }
  }
  for (int j = 0; j < 3; ++j) pthread_join(t[j], NULL);
  return NULL;
}
static void test_spawn(void) {
  long args[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) args[i] = i;
  run_threads(g_threads, spawn_worker, args, sizeof(long), NULL);
  long sum = 0;
  for (int i = 0; i < g_threads * 3; ++i) sum += sp_results[i];
  printf("spawn: threads=%d sum=%ld\n", g_threads * 3, sum);
}

/* ---- affinity: pin each thread to a CPU this process was started with. */
static void* affinity_worker(void* p) {
  long id = *(long*)p;
  long ncpu = sysconf(_SC_NPROCESSORS_CONF);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET((int)(id % ncpu), &set);
  *(long*)p = sched_setaffinity(0, sizeof(set), &set) == 0;
  return NULL;
}
static void test_affinity(void) {
  long args[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) args[i] = i;
  run_threads(g_threads, affinity_worker, args, sizeof(long), NULL);
  long ok = 0;
  for (int i = 0; i < g_threads; ++i) ok += args[i];
  CHECK(ok == g_threads, "sched_setaffinity failed in %ld threads", g_threads - ok);
  printf("affinity: pinned=%ld\n", ok);
}

/* ---- signals: a process-directed signal is handled once; a thread-directed one by that
 * thread (each worker is sent one, wherever it runs). */
static volatile sig_atomic_t sig_process_count;
static __thread volatile sig_atomic_t sig_mine;
static pthread_barrier_t sig_barrier;
static void on_usr1(int s) {
  (void)s;
  sig_process_count++;
}
static void on_usr2(int s) {
  (void)s;
  sig_mine = 1;
}
static void* signal_worker(void* p) {
  long* got = p;
  pthread_barrier_wait(&sig_barrier); /* main sends signals after this */
  pthread_barrier_wait(&sig_barrier); /* and they are delivered before this returns */
  *got = sig_mine;
  return NULL;
}
static void test_signal(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, NULL);
  sa.sa_handler = on_usr2;
  sigaction(SIGUSR2, &sa, NULL);
  sig_process_count = 0;
  pthread_barrier_init(&sig_barrier, NULL, (unsigned)g_threads + 1);
  long got[MAX_THREADS] = {0};
  pthread_t t[MAX_THREADS];
  for (int i = 0; i < g_threads; ++i) pthread_create(&t[i], NULL, signal_worker, &got[i]);
  pthread_barrier_wait(&sig_barrier);
  kill(getpid(), SIGUSR1);
  for (int i = 0; i < g_threads; ++i) pthread_kill(t[i], SIGUSR2);
  /* Delivery is asynchronous: wait until the process-directed one has been handled. */
  while (sig_process_count == 0) sched_yield();
  pthread_barrier_wait(&sig_barrier);
  for (int i = 0; i < g_threads; ++i) pthread_join(t[i], NULL);
  long targeted = 0;
  for (int i = 0; i < g_threads; ++i) targeted += got[i];
  CHECK(sig_process_count == 1 && targeted == g_threads, "signals: process=%d targeted=%ld",
        (int)sig_process_count, targeted);
  printf("signal: process_directed=%d thread_directed=%ld\n", (int)sig_process_count, targeted);
  pthread_barrier_destroy(&sig_barrier);
}

/* ---- exit / abort from a non-main thread while others block. */
static void* blocker(void* p) {
  (void)p;
  pthread_mutex_lock(&m_lock);
  pthread_mutex_lock(&m_lock); /* deadlocks itself: only the exit ends it */
  return NULL;
}
static void* exiter(void* p) {
  printf("exit: calling exit(42) from a thread\n");
  fflush(stdout);
  if (*(int*)p) abort();
  exit(42);
}
static void test_exit(int do_abort) {
  pthread_t t;
  pthread_create(&t, NULL, blocker, NULL);
  for (int i = 1; i < g_threads - 1; ++i) pthread_create(&t, NULL, blocker, NULL);
  static int flag;
  flag = do_abort;
  pthread_create(&t, NULL, exiter, &flag);
  pthread_join(t, NULL);
  for (;;) pause();
}

/* Whether `name` is one of the comma-separated names in `list`. */
static int listed(const char* list, const char* name) {
  size_t n = strlen(name);
  for (const char* p = list; *p;) {
    const char* comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return 1;
    if (!comma) break;
    p = comma + 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* test = "all";
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "--test=", 7)) {
      test = argv[i] + 7;
    } else if (!strncmp(argv[i], "--threads=", 10)) {
      g_threads = atoi(argv[i] + 10);
    } else if (!strncmp(argv[i], "--rounds=", 9)) {
      g_rounds = atol(argv[i] + 9);
    } else if (!strncmp(argv[i], "--start_gate_ms=", 16)) {
      g_start_gate_ms = atol(argv[i] + 16);
    } else {
      fprintf(stderr, "usage: %s [--test=NAME] [--threads=N] [--rounds=R] [--start_gate_ms=M]\n",
              argv[0]);
      return 2;
    }
  }
  if (g_threads < 2 || g_threads > MAX_THREADS || g_rounds < 1 || g_start_gate_ms < 0 ||
      g_start_gate_ms > 60000) {
    fprintf(stderr, "--threads must be 2..%d, --rounds positive, --start_gate_ms 0..60000\n",
            MAX_THREADS);
    return 2;
  }
  struct {
    const char* name;
    void (*fn)(void);
  } tests[] = {{"mutex", test_mutex},   {"condvar", test_condvar}, {"barrier", test_barrier},
               {"sem", test_sem},       {"atomic", test_atomic},   {"join", test_join},
               {"detach", test_detach}, {"malloc", test_malloc},   {"mmap", test_mmap},
               {"remap", test_remap},   {"spawn", test_spawn},     {"affinity", test_affinity},
               {"signal", test_signal}};
  if (!strcmp(test, "exit")) test_exit(0);
  if (!strcmp(test, "abort")) test_exit(1);
  int ran = 0;
  for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); ++i) {
    if (!strcmp(test, "all") || listed(test, tests[i].name)) {
      tests[i].fn();
      ran = 1;
    }
  }
  if (!ran) {
    fprintf(stderr, "unknown test '%s'\n", test);
    return 2;
  }
  return g_failed;
}
