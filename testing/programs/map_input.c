/* Reads its input file the way the original Phoenix programs do: mmap(MAP_PRIVATE) read-write
 * with length st_size + 1 (one byte past the end: a whole page past it when the size is a
 * multiple of the page size), then two threads sum alternate bytes many times over. With a
 * third argument "write", main first changes a few bytes of the mapping (its private copy);
 * with "read", it reads the file into malloc'd memory instead, as most programs do.
 * Usage: map_input FILE [PASSES [write|read]]. */
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

static unsigned char* data;
static long size, passes = 20000;
static unsigned long sums[2];

static void* worker(void* arg) {
  const long k = (long)arg;
  unsigned long s = 0;
  for (long p = 0; p < passes; p++) {
    for (long i = k; i < size; i += 2) s += data[i] * (unsigned long)(p + 1);
  }
  sums[k] = s;
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: map_input FILE [PASSES]\n");
    return 2;
  }
  if (argc > 2) passes = atol(argv[2]);
  const int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    perror(argv[1]);
    return 1;
  }
  size = st.st_size;
  if (argc > 3 && strcmp(argv[3], "read") == 0) {
    data = malloc(size + 1);
    for (long got = 0; data != NULL && got < size;) {
      const ssize_t n = read(fd, data + got, size - got);
      if (n <= 0) {
        perror("read");
        return 1;
      }
      got += n;
    }
  } else {
    data = mmap(NULL, size + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  }
  if (data == MAP_FAILED || data == NULL) {
    perror("mmap");
    return 1;
  }
  if (argc > 3 && strcmp(argv[3], "write") == 0) {
    for (long i = 0; i < size; i += size / 7 + 1) data[i] ^= 0x5a;
  }
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  for (long i = 0; i < 2; i++) pthread_join(t[i], NULL);
  printf("%lu %lu\n", sums[0], sums[1]);
  return 0;
}
