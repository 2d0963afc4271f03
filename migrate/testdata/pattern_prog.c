// Test program for checkpoint/restore: fills a heap buffer and a global array with a known
// pattern, prints their addresses, waits until the file named by argv[1] exists (the test
// creates it after the checkpoint), then verifies every byte and prints the result.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEAP_PAGES 256
static uint8_t global_pages[16 * 4096];

static uint8_t pattern(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: pattern_prog GO_FILE\n");
    return 2;
  }
  size_t n = HEAP_PAGES * 4096;
  uint8_t* heap = malloc(n);
  for (size_t i = 0; i < n; ++i) heap[i] = pattern(i);
  for (size_t i = 0; i < sizeof(global_pages); ++i) global_pages[i] = pattern(i + 7);
  printf("heap %p %zu global %p %zu ready\n", (void*)heap, n, (void*)global_pages,
         sizeof(global_pages));
  fflush(stdout);
  while (access(argv[1], F_OK) != 0) usleep(2000);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += heap[i] != pattern(i);
  for (size_t i = 0; i < sizeof(global_pages); ++i) bad += global_pages[i] != pattern(i + 7);
  printf("verified bad=%zu pid=%d\n", bad, (int)getpid());
  return bad == 0 ? 0 : 1;
}
