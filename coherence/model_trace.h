// How the model checker prints a counterexample: the label of each transition of a trace
// (a thread's operation, or the delivery of a channel's head) and the world before the
// failing step. Internal to the model checker.
#ifndef STRETCH_COHERENCE_MODEL_TRACE_H_
#define STRETCH_COHERENCE_MODEL_TRACE_H_

#include <string>

#include "coherence/model_checker.h"
#include "coherence/model_world.h"
#include "coherence/node.h"

namespace stretch::coherence::model {

// "n2" for a node, "dir" for endpoint `o.nodes`.
std::string EndpointName(const ModelOptions& o, int endpoint);

// "n0.t1 Store(p1)", with ", late fault" for an access that faults although the copy allows it.
std::string OperationLabel(int node, int thread, LocalOp op, int page, bool late_fault);

// "deliver dir -> n1: Data(M) p0 v1 data=latest acks=1": the head of channel c of `w`.
std::string DeliveryLabel(const ModelOptions& o, const World& w, int c);

// Every node's lines, copies and threads and the directory's lines, one line each, indented.
std::string DescribeWorld(const ModelOptions& o, const World& w);

}  // namespace stretch::coherence::model

#endif  // STRETCH_COHERENCE_MODEL_TRACE_H_
