// ServiceRouter: where a node agent hands the server's messages for the services of the
// replica it runs (futex replies, thread control, address-space changes, ...): each message
// type goes to the one handler set for it, if any.
//
//   router.Set<wire::FutexReply>([&](const wire::FutexReply& r) { OnReply(r); });
//   if (!router.Deliver(message)) { /* nobody handles this type here */ }
//   router.Set<wire::FutexReply>(nullptr);
//
// Handlers run on the delivering thread (the agent's network thread: they must not block),
// without the router's lock held: a handler may still be called once just after it was
// replaced. Thread-safe.
#ifndef STRETCH_ENGINE_SERVICE_ROUTER_H_
#define STRETCH_ENGINE_SERVICE_ROUTER_H_

#include <cstddef>
#include <functional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/wire.h"

namespace stretch::engine {

class ServiceRouter {
 public:
  // Sets (or, with nullptr, clears) the handler of messages of type T.
  template <typename T>
  void Set(std::function<void(const T&)> handler) {
    const size_t index = wire::Message(std::in_place_type<T>).index();
    absl::MutexLock l(&mu_);
    if (handler == nullptr) {
      handlers_.erase(index);
      return;
    }
    handlers_[index] = [handler = std::move(handler)](const wire::Message& m) {
      handler(std::get<T>(m));
    };
  }

  // Calls the handler of `m`'s type. False if none is set.
  bool Deliver(const wire::Message& m) {
    std::function<void(const wire::Message&)> handler;
    {
      absl::MutexLock l(&mu_);
      auto it = handlers_.find(m.index());
      if (it == handlers_.end()) return false;
      handler = it->second;
    }
    handler(m);
    return true;
  }

 private:
  absl::Mutex mu_;
  // By the index of the message's type in wire::Message.
  absl::flat_hash_map<size_t, std::function<void(const wire::Message&)>> handlers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace stretch::engine

#endif  // STRETCH_ENGINE_SERVICE_ROUTER_H_
