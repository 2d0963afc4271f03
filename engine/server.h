// DirectoryServer: `stretchd server`. Runs the MSI directory (coherence/directory.h) for every
// page of the regions that node agents announce, driven by messages from the transport, and
// keeps the home copy of pages no node owns (HomeStore: written-back copies, else the
// checkpoint's contents, else zeros). It tells every node where the others listen (Peers), so
// owners send pages straight to requesters.
//
// Failures stop the program rather than lose memory: when a node disconnects without saying
// goodbye, the server tells every other node (wire::Error naming the lost node) and they stop
// their processes; a request for a page owned by a node that left is refused (CohOp::kNack),
// and the requesting node stops its process, never handing it a zero page.
//
//   STRETCH_ASSIGN_OR_RETURN(auto server, DirectoryServer::Start(options));
//   std::string address = server->address();   // give it to the nodes
//   ...
//   server->Stop();
//
// One thread handles everything, so the directory needs no locks. Public methods are
// thread-safe.
#ifndef STRETCH_ENGINE_SERVER_H_
#define STRETCH_ENGINE_SERVER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/stats.h"
#include "engine/home_store.h"
#include "transport/transport.h"

namespace stretch::engine {

struct ServerOptions {
  // Transport backend ("tcp", "verbs", "loopback") and its options.
  std::string transport = "tcp";
  transport::TransportOptions transport_options;
  // Address to listen on ("IP:PORT"; port 0 picks one; "loop:NAME" for loopback).
  std::string listen = "127.0.0.1:0";
  // Initial page contents from a CRIU checkpoint (pagemap/pages of `checkpoint_pid`); empty:
  // pages start zero-filled.
  std::string checkpoint_images;
  int checkpoint_pid = 1;
  // Initial contents of the program's private file mappings that the checkpoint leaves to
  // their files (pages not written before it): read from the files here, never uploaded.
  std::vector<FileBacking> file_backings;
  // Most pages the directory tracks (one entry per page any node ever held or asked for, about
  // 100 bytes each, plus a home copy for pages written back). A request for one more stops the
  // program with an error naming the limit. Default: 16 Mi pages (64 GiB of shared memory).
  uint64_t max_pages = uint64_t{1} << 24;
};

// Per-node counters kept by the server.
struct ServerNodeStats {
  uint64_t read_requests = 0;   // GetS
  uint64_t write_requests = 0;  // GetM (misses and upgrades)
  uint64_t pages_held = 0;      // checkpoint pages its replica held from the start (PagesHeld)
  uint64_t evictions = 0;       // PutS / PutM
  uint64_t pages_sent = 0;      // grants with data from the home copy
  uint64_t invalidations_sent = 0;
  uint64_t forwards_sent = 0;  // FwdGetS / FwdGetM
  uint64_t writebacks = 0;     // pages received into the home copy
};

class DirectoryServer {
 public:
  static absl::StatusOr<std::unique_ptr<DirectoryServer>> Start(const ServerOptions& options);
  ~DirectoryServer();

  // Sets the pages' initial contents (ServerOptions::checkpoint_images and file_backings) of
  // a server started without them, before any node announces memory: a launcher starts its
  // server and lets its nodes join while the program still runs natively, and gives it the
  // checkpoint once written. FailedPrecondition if a node has announced a region or initial
  // memory was already given.
  absl::Status LoadInitialMemory(const std::string& checkpoint_images, int checkpoint_pid,
                                 const std::vector<FileBacking>& file_backings);

  // The address nodes connect to.
  const std::string& address() const { return address_; }
  // Number of nodes connected now, and lost (disconnected without goodbye) so far.
  int connected_nodes() const;
  int lost_nodes() const;
  // {"nodes":[{"node":0,"read_requests":..},...],"pages":N,"home_pages":N,"lost_nodes":[..]}
  std::string StatsJson() const;
  // Waits until `n` nodes are connected (or the deadline passes: false).
  bool WaitForNodes(int n, absl::Time deadline) const;

  // Stops the thread and closes the transport. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit DirectoryServer(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_SERVER_H_
