/* Threads that share pages in ways a watch of the program's accesses must see, and survive:
 *
 *   access_sharing pipe SECONDS   thread 2 (the producer) rewrites one page every millisecond;
 *                                 thread 3 (the consumer) reads it without pause. The page's
 *                                 address is printed first.
 *   access_sharing churn SECONDS  threads 2 and 3 rewrite and check pages of their own; thread 4
 *                                 meanwhile discards (MADV_DONTNEED), moves (mremap), unmaps and
 *                                 remaps pages it wrote, and forks children that check what they
 *                                 inherited. Every page is checked against what its thread last
 *                                 wrote (zeros after a discard).
 *
 * Main joins the threads (the migration point). Prints "done 1" if every check held, else
 * "done 0" and the first failure. Runs for SECONDS of wall clock. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define WORDS (PAGE / sizeof(uint64_t))
#define OWN_PAGES 32

static double seconds;
static volatile int failed;
static char failure[128];
static uint64_t* pipe_page;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void fail(const char* what) {
  if (!failed) snprintf(failure, sizeof(failure), "%s", what);
  failed = 1;
}

static uint64_t pattern(const void* page, uint64_t version, size_t word) {
  return ((uintptr_t)page >> 12) * 1000003u + version * 7919u + word;
}

static void fill(uint64_t* page, uint64_t version) {
  for (size_t i = 0; i < WORDS; i++) page[i] = pattern(page, version, i);
}

/* Whether `page` holds what fill(page-as-it-was-at `origin`, version) wrote. */
static int holds(const uint64_t* page, const void* origin, uint64_t version) {
  for (size_t i = 0; i < WORDS; i++) {
    if (page[i] != pattern(origin, version, i)) return 0;
  }
  return 1;
}

static int zero(const uint64_t* page) {
  for (size_t i = 0; i < WORDS; i++) {
    if (page[i] != 0) return 0;
  }
  return 1;
}

static void* producer(void* arg) {
  (void)arg;
  const double end = now() + seconds;
  for (uint64_t seq = 1; now() < end; seq++) {
    for (size_t i = 0; i < WORDS; i++) pipe_page[i] = seq;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  return NULL;
}

static void* consumer(void* arg) {
  (void)arg;
  const double end = now() + seconds;
  uint64_t sum = 0;
  while (now() < end) {
    for (size_t i = 0; i < WORDS; i++) sum += ((volatile uint64_t*)pipe_page)[i];
  }
  return (void*)(uintptr_t)sum;
}

/* Threads 2 and 3: pages of their own, rewritten and checked over and over. */
static void* owner(void* arg) {
  (void)arg;
  uint64_t* pages =
      mmap(NULL, OWN_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED) {
    fail("mmap");
    return NULL;
  }
  const double end = now() + seconds;
  for (uint64_t v = 1; now() < end; v++) {
    for (int p = 0; p < OWN_PAGES; p++) {
      uint64_t* page = pages + p * WORDS;
      if (v > 1 && !holds(page, page, v - 1)) fail("an owned page lost its contents");
      fill(page, v);
    }
  }
  return NULL;
}

/* Thread 4: the program's own address-space changes, on pages it wrote. */
static void* churner(void* arg) {
  (void)arg;
  const double end = now() + seconds;
  char* a = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char* b = mmap(NULL, 4 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char* c = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED || b == MAP_FAILED || c == MAP_FAILED) {
    fail("mmap");
    return NULL;
  }
  struct timespec pause = {0, 2000000}; /* a watch interval may begin in one */
  for (uint64_t v = 1; now() < end && !failed; v++) {
    /* Written, then discarded: zeros. */
    fill((uint64_t*)a, v);
    if (!holds((uint64_t*)a, a, v)) fail("a written page lost its contents");
    if (madvise(a, PAGE, MADV_DONTNEED) != 0) fail("madvise");
    if (!zero((uint64_t*)a)) fail("a discarded page is not zero");
    /* Written, then moved away and back: the contents move along. */
    fill((uint64_t*)(a + PAGE), v);
    fill((uint64_t*)(a + 2 * PAGE), v);
    nanosleep(&pause, NULL);
    if (mremap(a, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, b) != b) {
      fail("mremap");
      return NULL;
    }
    if (!holds((uint64_t*)(b + PAGE), a + PAGE, v) ||
        !holds((uint64_t*)(b + 2 * PAGE), a + 2 * PAGE, v)) {
      fail("a moved page lost its contents");
    }
    /* A child sees what was written before the fork. */
    fill((uint64_t*)(b + 3 * PAGE), v);
    nanosleep(&pause, NULL);
    pid_t child = fork();
    if (child == 0) {
      if (!holds((uint64_t*)(b + PAGE), a + PAGE, v)) _exit(1);
      if (!holds((uint64_t*)(b + 3 * PAGE), b + 3 * PAGE, v)) _exit(2);
      _exit(0);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      static char what[96];
      snprintf(what, sizeof(what), "a forked child saw other contents (%d, status %x, b %p)",
               child < 0 ? -1 : WEXITSTATUS(status), status, (void*)b);
      fail(what);
    }
    /* Back where it was; `b` becomes a reserved hole again. */
    if (mremap(b, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a) != a ||
        mmap(b, 4 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != b) {
      fail("mremap back");
      return NULL;
    }
    if (!holds((uint64_t*)(a + 3 * PAGE), b + 3 * PAGE, v)) fail("a moved page lost its contents");
    /* Written, unmapped, mapped anew: zeros. */
    fill((uint64_t*)c, v);
    nanosleep(&pause, NULL);
    if (munmap(c, PAGE) != 0 || mmap(c, PAGE, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != c) {
      fail("munmap");
      return NULL;
    }
    if (!zero((uint64_t*)c)) fail("a page mapped anew is not zero");
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "pipe") != 0 && strcmp(argv[1], "churn") != 0)) {
    fprintf(stderr, "usage: access_sharing pipe|churn SECONDS\n");
    return 2;
  }
  seconds = atof(argv[2]);
  pthread_t t[3];
  int n = 0;
  if (strcmp(argv[1], "pipe") == 0) {
    pipe_page = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pipe_page == MAP_FAILED) return 1;
    pipe_page[0] = 0; /* present before the watch */
    printf("page %p\n", (void*)pipe_page);
    fflush(stdout);
    pthread_create(&t[n++], NULL, producer, NULL);
    pthread_create(&t[n++], NULL, consumer, NULL);
  } else {
    pthread_create(&t[n++], NULL, owner, NULL);
    pthread_create(&t[n++], NULL, owner, NULL);
    pthread_create(&t[n++], NULL, churner, NULL);
  }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  if (failed) {
    printf("done 0 %s\n", failure);
  } else {
    printf("done 1\n");
  }
  return 0;
}
