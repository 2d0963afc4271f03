#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int g_manual; /* --manual: wl_alloc maps shared memory */

static long parse_long(const char* flag, const char* v) {
  char* end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end != '\0') {
    fprintf(stderr, "bad value for %s: '%s'\n", flag, v);
    exit(2);
  }
  return x;
}

void wl_parse(int argc, char** argv, wl_args* a, long default_size, int default_iterations,
              const char* usage) {
  a->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  a->size = default_size;
  a->seed = 1;
  a->iterations = default_iterations;
  a->pin = 0;
  a->per_phase = 0;
  a->manual = 0;
  for (int i = 1; i < argc; ++i) {
    const char* s = argv[i];
    const char* eq = strchr(s, '=');
    if (!strcmp(s, "--pin")) {
      a->pin = 1;
    } else if (!strcmp(s, "--per_phase")) {
      a->per_phase = 1;
    } else if (!strcmp(s, "--manual")) {
      a->manual = 1;
    } else if (eq && !strncmp(s, "--threads=", 10)) {
      a->threads = (int)parse_long("--threads", eq + 1);
    } else if (eq && !strncmp(s, "--size=", 7)) {
      a->size = parse_long("--size", eq + 1);
    } else if (eq && !strncmp(s, "--seed=", 7)) {
      a->seed = (uint64_t)parse_long("--seed", eq + 1);
    } else if (eq && !strncmp(s, "--iterations=", 13)) {
      a->iterations = (int)parse_long("--iterations", eq + 1);
    } else {
      fprintf(stderr, "unknown argument '%s'\nusage: %s %s\n", s, argv[0], usage);
      exit(2);
    }
  }
  if (a->threads < 1 || a->threads > 1024 || a->size < 1 || a->iterations < 1) {
    fprintf(stderr, "--threads must be 1..1024, --size and --iterations positive\n");
    exit(2);
  }
#ifdef _OPENMP
  /* libgomp owns the threads and their synchronization: it keeps one team between parallel
   * regions (no fresh threads per phase) and its barriers live in malloc'd memory, which manual
   * mode does not keep coherent. */
  if (a->per_phase || a->manual) {
    fprintf(stderr, "%s is not available in the OpenMP build (libgomp keeps its own team of "
            "threads and their synchronization); use the pthread build\n",
            a->per_phase ? "--per_phase" : "--manual");
    exit(2);
  }
#endif
  if (a->manual && a->per_phase) {
    fprintf(stderr, "--manual works with the worker pool, not --per_phase\n");
    exit(2);
  }
  g_manual = a->manual;
}

double wl_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void wl_timed_wait_ms(long ms) {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&mu);
  while (pthread_cond_timedwait(&cv, &mu, &until) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&mu);
}

void wl_report_time(const char* phase, double start_ms) {
  fprintf(stderr, "time_ms %s %.3f\n", phase, wl_now_ms() - start_ms);
}

/* Shared allocations keep their size just before the (page-aligned) block. */
#define WL_PAGE 4096
void* wl_alloc(size_t bytes) {
  if (g_manual) {
    size_t total = (bytes + WL_PAGE + WL_PAGE - 1) / WL_PAGE * WL_PAGE;
    char* m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      fprintf(stderr, "mmap of %zu shared bytes: %s\n", total, strerror(errno));
      exit(1);
    }
    *(size_t*)m = total;
    return m + WL_PAGE;
  }
  void* p = malloc(bytes);
  if (p == NULL) {
    fprintf(stderr, "out of memory allocating %zu bytes\n", bytes);
    exit(1);
  }
  return p;
}

void wl_free(void* p) {
  if (p == NULL) return;
  if (g_manual) {
    char* m = (char*)p - WL_PAGE;
    munmap(m, *(size_t*)m);
    return;
  }
  free(p);
}

/* Phoenix pins each worker at every phase and gives up if the kernel refuses. */
static void pin_worker(int i) {
  long ncpu = sysconf(_SC_NPROCESSORS_CONF);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET((int)(i % ncpu), &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    perror("sched_setaffinity");
    abort();
  }
}

#ifdef _OPENMP
/* The OpenMP build: every phase is one `#pragma omp parallel` region of `threads` threads, the
 * main thread working in it as thread 0 (libgomp's master), the others libgomp's team, which
 * spins and then futex-waits between regions (OMP_WAIT_POLICY, GOMP_SPINCOUNT). */
struct wl_pool {
  const wl_args* args;
};

wl_pool* wl_pool_start(const wl_args* a) {
  wl_pool* p = wl_alloc(sizeof(*p));
  p->args = a;
  omp_set_dynamic(0);
  return p;
}

void wl_pool_run(wl_pool* p, wl_task task, void* arg) {
  const wl_args* a = p->args;
#pragma omp parallel num_threads(a->threads)
  {
    /* omp_set_dynamic(0): the team has a->threads threads unless the system refuses them;
     * slices follow the team's real size, so the result is the same either way. */
    int n = omp_get_num_threads();
    int i = omp_get_thread_num();
    if (a->pin) pin_worker(i);
    task(i, n, arg);
  }
}

void wl_pool_stop(wl_pool* p) {
  if (p != NULL) wl_free(p);
}

void wl_phase(const wl_args* a, wl_pool* p, wl_task task, void* arg) {
  (void)a;
  wl_pool_run(p, task, arg);
}
#else
/* Each synchronization object on a page of its own (manual mode's rule; it also keeps the
 * workers' condition variable off the page main's counters are written on). */
struct wl_pool {
  _Alignas(WL_PAGE) pthread_mutex_t mu;
  _Alignas(WL_PAGE) pthread_cond_t start;
  _Alignas(WL_PAGE) pthread_cond_t done;
  _Alignas(WL_PAGE) const wl_args* args;
  int n;
  pthread_t* threads;
  long generation; /* phases started */
  int remaining;   /* workers still running the current phase */
  int stop;
  wl_task task;
  void* arg;
};

typedef struct {
  wl_pool* pool;
  int index;
} worker_ctx;

static void* pool_worker(void* p) {
  worker_ctx* ctx = p;
  wl_pool* pool = ctx->pool;
  long seen = 0;
  for (;;) {
    pthread_mutex_lock(&pool->mu);
    while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pool->start, &pool->mu);
    if (pool->stop) {
      pthread_mutex_unlock(&pool->mu);
      break;
    }
    seen = pool->generation;
    wl_task task = pool->task;
    void* arg = pool->arg;
    pthread_mutex_unlock(&pool->mu);
    if (pool->args->pin) pin_worker(ctx->index);
    task(ctx->index, pool->n, arg);
    pthread_mutex_lock(&pool->mu);
    if (--pool->remaining == 0) pthread_cond_signal(&pool->done);
    pthread_mutex_unlock(&pool->mu);
  }
  wl_free(ctx);
  return NULL;
}

wl_pool* wl_pool_start(const wl_args* a) {
  wl_pool* p;
  if (g_manual) {
    p = wl_alloc(sizeof(*p)); /* page-aligned */
  } else if (posix_memalign((void**)&p, WL_PAGE, sizeof(*p)) != 0) {
    fprintf(stderr, "out of memory allocating the worker pool\n");
    exit(1);
  }
  memset(p, 0, sizeof(*p));
  p->args = a;
  p->n = a->threads;
  p->threads = wl_alloc(sizeof(pthread_t) * (size_t)p->n);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int i = 0; i < p->n; ++i) {
    worker_ctx* ctx = wl_alloc(sizeof(*ctx));
    ctx->pool = p;
    ctx->index = i;
    int err = pthread_create(&p->threads[i], NULL, pool_worker, ctx);
    if (err) {
      fprintf(stderr, "pthread_create: %s\n", strerror(err));
      exit(1);
    }
  }
  return p;
}

void wl_pool_run(wl_pool* p, wl_task task, void* arg) {
  pthread_mutex_lock(&p->mu);
  p->task = task;
  p->arg = arg;
  p->remaining = p->n;
  p->generation++;
  pthread_cond_broadcast(&p->start);
  while (p->remaining > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void wl_pool_stop(wl_pool* p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n; ++i) pthread_join(p->threads[i], NULL);
  wl_free(p->threads);
  if (g_manual) {
    wl_free(p);
  } else {
    free(p);
  }
}

typedef struct {
  const wl_args* args;
  wl_task task;
  void* arg;
  int index;
} phase_ctx;

static void* phase_thread(void* p) {
  phase_ctx* c = p;
  if (c->args->pin) pin_worker(c->index);
  c->task(c->index, c->args->threads, c->arg);
  return NULL;
}

void wl_phase(const wl_args* a, wl_pool* p, wl_task task, void* arg) {
  if (!a->per_phase) {
    wl_pool_run(p, task, arg);
    return;
  }
  pthread_t* t = wl_alloc(sizeof(pthread_t) * (size_t)a->threads);
  phase_ctx* c = wl_alloc(sizeof(phase_ctx) * (size_t)a->threads);
  for (int i = 0; i < a->threads; ++i) {
    c[i] = (phase_ctx){a, task, arg, i};
    int err = pthread_create(&t[i], NULL, phase_thread, &c[i]);
    if (err) {
      fprintf(stderr, "pthread_create: %s\n", strerror(err));
      exit(1);
    }
  }
  for (int i = 0; i < a->threads; ++i) pthread_join(t[i], NULL);
  free(t);
  free(c);
}
#endif
