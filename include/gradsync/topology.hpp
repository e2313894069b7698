// gradsync: where the ranks are. Which ranks share a node decides what carries their traffic
// (shared memory within a node, the network between nodes) and so the sync's plan.
#pragma once

#include <string>

namespace gradsync {

/// The shape of a backend's ranks over nodes, found once when the backend is built
/// (MpiBackend: MPI_Comm_split_type with MPI_COMM_TYPE_SHARED). The same on every rank.
struct Topology {
  int nodes = 1;           ///< nodes the ranks are on
  int node = 0;            ///< this rank's node, 0 .. nodes-1 (ordered by their lowest rank)
  int local_rank = 0;      ///< this rank among its node's ranks
  int local_size = 1;      ///< ranks on this rank's node
  int min_local_size = 1;  ///< fewest ranks on a node
  int max_local_size = 1;  ///< most ranks on a node

  /// Whether traffic between some ranks crosses a network (more than one node).
  bool spans_nodes() const { return nodes > 1; }
  /// Whether a hierarchical reduction differs from a flat one: several nodes, one of them with
  /// more than one rank.
  bool hierarchical_helps() const { return nodes > 1 && max_local_size > 1; }
};

/// How a fused chunk's sum crosses the ranks.
enum class Algorithm {
  automatic,     ///< the plan decides: flat on one node; across nodes, flat and hierarchical are
                 ///< both timed on the first steps and the faster is kept (all ranks agree)
  flat,          ///< one allreduce over all ranks (gradsync's ring or MPI's own)
  hierarchical,  ///< reduce within each node, allreduce among one leader per node, broadcast
                 ///< within each node (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE). Nonblocking on
                 ///< MpiBackend (each stage started when the one before it is done; chunks in flight
                 ///< and waited under the stall watchdog as flat ones); three blocking calls per chunk
                 ///< with Collectives::blocking or on a backend with only the blocking form
};

/// "automatic", "flat" or "hierarchical".
inline const char* to_string(Algorithm a) {
  return a == Algorithm::automatic ? "automatic" : a == Algorithm::flat ? "flat" : "hierarchical";
}

/// "2 nodes x 4 ranks" (or "..., 2-4 ranks per node" when nodes differ). Local; allocates the string.
inline std::string describe_topology(const Topology& t) {
  std::string s = std::to_string(t.nodes) + (t.nodes == 1 ? " node" : " nodes");
  if (t.min_local_size == t.max_local_size)
    s += " x " + std::to_string(t.max_local_size) + (t.max_local_size == 1 ? " rank" : " ranks");
  else
    s += ", " + std::to_string(t.min_local_size) + "-" + std::to_string(t.max_local_size) + " ranks per node";
  return s;
}

}  // namespace gradsync
