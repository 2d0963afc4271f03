// libfabric loaded on first use: the symbols bound, the fatal signals' dispositions as they
// were before the load (libinfinipath's constructor replaces them), nothing loaded before, and
// (as root) the providers initialized without the verbs provider's scans of /proc/kallsyms.
#include "transport/libfabric.h"

#include <dlfcn.h>
#include <rdma/fi_errno.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace stretch::transport::libfabric {
namespace {

bool PsmLoaded() {
  void* h = dlopen("libinfinipath.so.4", RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) dlclose(h);
  return h != nullptr;
}

// Bytes this process has read with read() and its kin, its threads' included (/proc/self/io).
int64_t BytesRead() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = -1;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return -1;
}

std::string MountNamespace() {
  char buf[64] = {};
  return readlink("/proc/self/ns/mnt", buf, sizeof(buf) - 1) > 0 ? buf : "";
}

// One test: the process loads the library once, so its order matters.
TEST(LibfabricTest, LoadsOnFirstUseAndLeavesTheSignalsAsTheyWere) {
  EXPECT_FALSE(PsmLoaded()) << "loaded at start: a binary links libfabric";
  signal(SIGTERM, SIG_IGN);  // the process's own choice, kept
  // What the process has before (the defaults; ASan's own handlers in an ASan build).
  constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGINT, SIGTERM};
  struct sigaction before[7];
  for (int i = 0; i < 7; ++i) ASSERT_EQ(sigaction(kFatal[i], nullptr, &before[i]), 0);
  const std::string mnt = MountNamespace();
  const int64_t read_before = BytesRead();
  ASSERT_TRUE(Load().ok()) << Load();
  const int64_t read_by_load = BytesRead() - read_before;
  EXPECT_TRUE(Load().ok());
  EXPECT_EQ(MountNamespace(), mnt);
  if (geteuid() == 0) {
    // One scan reads all of it; the process still sees it whole.
    std::ifstream kallsyms("/proc/kallsyms");
    const int64_t size = static_cast<int64_t>(
        std::string(std::istreambuf_iterator<char>(kallsyms), {}).size());
    ASSERT_GT(size, 1 << 20);
    EXPECT_LT(read_by_load, size / 4) << "the verbs provider read /proc/kallsyms at init";
  }
  EXPECT_TRUE(PsmLoaded()) << "the test no longer sees the constructor it guards against";
  for (int i = 0; i < 7; ++i) {
    struct sigaction sa;
    ASSERT_EQ(sigaction(kFatal[i], nullptr, &sa), 0);
    EXPECT_EQ(sa.sa_handler, before[i].sa_handler) << "signal " << kFatal[i];
  }
  signal(SIGTERM, SIG_DFL);
  EXPECT_EXIT(abort(), ::testing::KilledBySignal(SIGABRT), "");

  // The bound functions work, with the current struct layout (mr_mode is there).
  fi_info* hints = AllocInfo();
  ASSERT_NE(hints, nullptr);
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG;
  hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
  fi_info* info = nullptr;
  ASSERT_EQ(GetInfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &info), 0);
  ASSERT_NE(info, nullptr);
  EXPECT_NE(info->domain_attr, nullptr);
  fi_info* copy = DupInfo(info);
  ASSERT_NE(copy, nullptr);
  EXPECT_STREQ(copy->fabric_attr->prov_name, info->fabric_attr->prov_name);
  FreeInfo(copy);
  FreeInfo(info);
  FreeInfo(hints);
  EXPECT_STRNE(StrError(FI_ENODATA), "");
}

}  // namespace
}  // namespace stretch::transport::libfabric
