#include "coherence/model_codec.h"

#include <algorithm>

#include "glog/logging.h"

namespace stretch::coherence::model {

using wire::CohOp;

void Codec::Encode(const World& w, std::string* out) {
  const int n = o_.nodes;
  std::vector<int>& order = order_;
  order.resize(n);
  for (int k = 0; k < n; ++k) order[k] = k;
  if (!o_.symmetry || n == 1) return EncodeAs(w, order, out);
  sig_.resize(n);
  for (int k = 0; k < n; ++k) LocalSignature(w, k, &sig_[k]);
  std::sort(order.begin(), order.end(), [this](int a, int b) { return sig_[a] < sig_[b]; });
  // Try every order of nodes with equal signatures; keep the smallest encoding.
  std::vector<std::pair<int, int>> ties;  // [begin, end) runs of equal signatures
  for (int b = 0; b < n;) {
    int e = b + 1;
    while (e < n && sig_[order[e]] == sig_[order[b]]) ++e;
    if (e - b > 1) ties.emplace_back(b, e);
    b = e;
  }
  for (auto [b, e] : ties) std::sort(order.begin() + b, order.begin() + e);
  EncodeAs(w, order, out);
  if (ties.empty()) return;
  // Enumerate the product of the permutations of each run (odometer over the runs).
  while (true) {
    size_t r = 0;
    for (; r < ties.size(); ++r) {
      if (std::next_permutation(order.begin() + ties[r].first, order.begin() + ties[r].second)) {
        break;
      }
    }
    if (r == ties.size()) break;
    EncodeAs(w, order, &candidate_);
    if (candidate_ < *out) out->swap(candidate_);
  }
}

void Codec::LocalSignature(const World& w, int k, std::string* out) const {
  out->clear();
  for (int p = 0; p < o_.pages; ++p) {
    const NodePage& np = w.npage[k * o_.pages + p];
    const Mem& m = w.mem[k * o_.pages + p];
    out->push_back(static_cast<char>(np.line.state));
    out->push_back(static_cast<char>(np.line.version));
    out->push_back(static_cast<char>(m.present | m.writable << 1 | m.fresh << 2));
  }
  for (int t = 0; t < o_.threads; ++t) {
    const Thread& th = w.thread[k * o_.threads + t];
    out->push_back(static_cast<char>(th.pc));
    out->push_back(static_cast<char>(th.page));
  }
}

void Codec::EncodeAs(const World& w, const std::vector<int>& order, std::string* out) {
  const int n = o_.nodes;
  std::vector<int>& rename = rename_;  // old id -> new id
  rename.resize(n);
  for (int j = 0; j < n; ++j) rename[order[j]] = j;
  const auto id = [&](NodeId x) -> uint64_t {
    return x.value() < static_cast<uint32_t>(n) ? rename[x.value()] : x.value();
  };
  const auto endpoint = [&](int j) { return j == n ? n : order[j]; };
  out->clear();
  const auto put = [out](uint64_t v) {
    CHECK_LT(v, 256u) << "model checker: a value outgrew its byte";
    out->push_back(static_cast<char>(v));
  };
  for (int j = 0; j < n; ++j) {
    for (int p = 0; p < o_.pages; ++p) {
      const int i = order[j] * o_.pages + p;
      const NodePage& np = w.npage[i];
      put(static_cast<uint8_t>(np.line.state));
      put(np.line.version);
      put(np.line.acks_received);
      put(np.line.acks_needed);
      put(np.stalled.size());
      for (const NodeEvent& e : np.stalled) put(static_cast<uint8_t>(e.type));
      const Mem& m = w.mem[i];
      put(m.present | m.writable << 1 | m.has_stash << 2 | m.fresh << 3 | m.stash_fresh << 4);
    }
  }
  for (int j = 0; j < n; ++j) {
    for (int t = 0; t < o_.threads; ++t) {
      const Thread& th = w.thread[order[j] * o_.threads + t];
      put(th.pc);
      put(th.page < 0 ? 0xFF : (th.page << 2 | static_cast<int>(th.op)));
    }
  }
  for (int p = 0; p < o_.pages; ++p) {
    const DirPage& d = w.dpage[p];
    put(static_cast<uint8_t>(d.line.state));
    put(id(d.line.owner));
    uint64_t sharers = 0;
    d.line.sharers.ForEach([&](NodeId x) { sharers |= uint64_t{1} << id(x); });
    put(sharers);
    put(id(d.line.requester));
    put(d.line.version);
    put(d.queue.size());
    for (const DirRequest& r : d.queue) {
      put(static_cast<uint8_t>(r.op));
      put(r.flags);
      put(id(r.src));
      put(r.version);
    }
    put(w.home[p]);
  }
  for (int js = 0; js < e_; ++js) {
    for (int jd = 0; jd < e_; ++jd) {
      if (js == jd) continue;
      for (int lane = 0; lane < ch_.lanes(); ++lane) {
        const std::vector<Msg>& q = w.chan[ch_.Index(endpoint(js), endpoint(jd), lane)];
        put(q.size());
        for (const Msg& m : q) {
          put(static_cast<uint8_t>(m.op));
          put(m.flags);
          put(id(NodeId(m.requester)));
          put(m.ack_count);
          put(m.page | m.fresh << 4);
          put(m.version);
        }
      }
    }
  }
}

void Codec::Decode(std::string_view in, World* w) const {
  size_t i = 0;
  const auto get = [&]() -> uint8_t { return static_cast<uint8_t>(in[i++]); };
  const int np = o_.nodes * o_.pages;
  w->npage.resize(np);
  w->mem.resize(np);
  for (int k = 0; k < np; ++k) {
    NodePage& p = w->npage[k];
    p.line.state = static_cast<NodeState>(get());
    p.line.version = get();
    p.line.acks_received = get();
    p.line.acks_needed = get();
    p.stalled.clear();
    for (int n = get(); n > 0; --n) {
      NodeEvent e;
      e.type = static_cast<NodeEventType>(get());
      p.stalled.push_back(e);
    }
    Mem& m = w->mem[k];
    const uint8_t bits = get();
    m.present = bits & 1;
    m.writable = bits & 2;
    m.has_stash = bits & 4;
    m.fresh = bits & 8;
    m.stash_fresh = bits & 16;
  }
  w->thread.resize(o_.nodes * o_.threads);
  for (Thread& t : w->thread) {
    t.pc = get();
    const uint8_t b = get();
    t.page = b == 0xFF ? -1 : static_cast<int8_t>(b >> 2);
    t.op = static_cast<LocalOp>(b == 0xFF ? 0 : b & 3);
  }
  w->dpage.resize(o_.pages);
  w->home.resize(o_.pages);
  for (int p = 0; p < o_.pages; ++p) {
    DirPage& d = w->dpage[p];
    d.line.state = static_cast<DirState>(get());
    d.line.owner = NodeId(get());
    d.line.sharers = NodeSet::FromBits(get());
    d.line.requester = NodeId(get());
    d.line.version = get();
    d.queue.clear();
    for (int n = get(); n > 0; --n) {
      DirRequest r;
      r.op = static_cast<CohOp>(get());
      r.flags = get();
      r.src = NodeId(get());
      r.version = get();
      d.queue.push_back(r);
    }
    w->home[p] = get();
  }
  w->chan.resize(ch_.count());
  for (int c = 0; c < ch_.count(); ++c) {
    std::vector<Msg>& q = w->chan[c];
    q.clear();
    if (ch_.Src(c) == ch_.Dst(c)) continue;
    for (int n = get(); n > 0; --n) {
      Msg m;
      m.op = static_cast<CohOp>(get());
      m.flags = get();
      m.requester = get();
      m.ack_count = get();
      const uint8_t pf = get();
      m.page = pf & 15;
      m.fresh = pf >> 4;
      m.version = get();
      q.push_back(m);
    }
  }
  DCHECK_EQ(i, in.size());
}

}  // namespace stretch::coherence::model
