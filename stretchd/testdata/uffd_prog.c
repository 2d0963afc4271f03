/* Holds a userfaultfd of its own (which CRIU cannot checkpoint) while 4 threads compute. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static long g_sums[4];

static void* worker(void* p) {
  long id = (long)p, s = 0;
  for (long i = 0; i < 50000000; ++i) s += i & id;
  g_sums[id] = s;
  return NULL;
}

int main(void) {
  int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
  if (fd < 0) {
    perror("userfaultfd");
    return 1;
  }
  pthread_t t[4];
  for (long i = 0; i < 4; ++i) pthread_create(&t[i], NULL, worker, (void*)i);
  for (int i = 0; i < 4; ++i) pthread_join(t[i], NULL);
  printf("sums %ld %ld %ld %ld\n", g_sums[0], g_sums[1], g_sums[2], g_sums[3]);
  return 0;
}
