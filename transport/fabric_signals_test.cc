// A binary that links libfabric keeps the default dispositions of fatal signals: without
// RestoreDefaultSignalHandlers, libinfinipath (loaded by Debian's libfabric) turns abort() into
// exit(1) (fabric_transport.h).
#include <signal.h>
#include <stdlib.h>

#include "gtest/gtest.h"
#include "transport/fabric_transport.h"

namespace stretch::transport {
namespace {

TEST(FabricSignalsTest, FatalSignalsHaveTheirDefaultDispositionsAtStart) {
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGINT, SIGTERM}) {
    struct sigaction sa;
    ASSERT_EQ(sigaction(sig, nullptr, &sa), 0);
    EXPECT_EQ(sa.sa_handler, SIG_DFL) << "signal " << sig;
  }
}

TEST(FabricSignalsTest, AbortKillsWithSigabrt) {
  // Uses the library, so that it is linked in, as in every binary that talks to a fabric.
  ConfigureLibfabricEnvironment();
  EXPECT_EXIT(abort(), ::testing::KilledBySignal(SIGABRT), "");
}

TEST(FabricSignalsTest, AHandlerInstalledLaterIsLeftAlone) {
  struct sigaction old;
  ASSERT_EQ(sigaction(SIGUSR1, nullptr, &old), 0);
  signal(SIGTERM, SIG_IGN);
  RestoreDefaultSignalHandlers();
  struct sigaction sa;
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &sa), 0);
  EXPECT_EQ(sa.sa_handler, SIG_IGN);
  signal(SIGTERM, SIG_DFL);
}

}  // namespace
}  // namespace stretch::transport
