// The model checker's state encoding: a World (model_world.h) as a compact byte string, the
// key under which the search stores and deduplicates states (model_state_store.h), and back.
// With ModelOptions::symmetry the encoding is canonical over node renamings, so worlds that
// differ only by the names of the nodes encode alike. Internal to the model checker.
//
//   Codec codec(options);
//   codec.Encode(world, &bytes);
//   codec.Decode(bytes, &world);   // the world, with nodes in canonical order
//
// Thread-compatible; Encode() uses scratch space in the Codec.
#ifndef STRETCH_COHERENCE_MODEL_CODEC_H_
#define STRETCH_COHERENCE_MODEL_CODEC_H_

#include <string>
#include <string_view>
#include <vector>

#include "coherence/model_checker.h"
#include "coherence/model_world.h"

namespace stretch::coherence::model {

class Codec {
 public:
  explicit Codec(const ModelOptions& o) : o_(o), e_(o.nodes + 1), ch_(o) {}

  // The canonical encoding of `w`: with symmetry reduction, the smallest encoding over the
  // node renamings that list nodes in the order of their local state (all nodes run the same
  // nondeterministic program and the directory treats node ids only as names, so renamed
  // worlds behave alike and the properties checked do not depend on names). CHECK-fails if a
  // value outgrows its byte.
  void Encode(const World& w, std::string* out);
  void Decode(std::string_view in, World* w) const;

 private:
  // The part of the state that belongs to node k alone (lines, memory, threads).
  void LocalSignature(const World& w, int k, std::string* out) const;
  // Encodes `w` with node order[j] renamed to j.
  void EncodeAs(const World& w, const std::vector<int>& order, std::string* out);

  const ModelOptions& o_;
  const int e_;
  const Channels ch_;
  // Scratch space (Encode is not reentrant).
  std::vector<int> order_, rename_;
  std::vector<std::string> sig_;
  std::string candidate_;
};

}  // namespace stretch::coherence::model

#endif  // STRETCH_COHERENCE_MODEL_CODEC_H_
