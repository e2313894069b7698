// gradsync internals: ranks as text, for the messages that name them.
//
// Reports and mismatch errors name sets of ranks; on many ranks a flat list is unreadable, so runs
// are folded ("[0, 2-4]") and ranks that reported the same thing are grouped.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "../error.hpp"

namespace gradsync::impl {

// "[0, 2-4]" for ranks {0, 2, 3, 4}.
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
    if (j > i) s += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s + "]";
}

// Groups ranks by what they reported: "rank 0: X; ranks [1-3]: Y" (`sep` between the ranks and
// their text). `ranks[k]` reported `what[k]`; without `ranks`, what[r] is rank r's.
inline std::string by_rank(const std::vector<int>& ranks, const std::vector<std::string>& what,
                           const char* sep = ": ") {
  std::vector<std::string> order;
  std::vector<std::vector<int>> groups;
  for (std::size_t k = 0; k < what.size(); ++k) {
    const auto it = std::find(order.begin(), order.end(), what[k]);
    if (it == order.end()) {
      order.push_back(what[k]);
      groups.push_back({ranks[k]});
    } else {
      groups[std::size_t(it - order.begin())].push_back(ranks[k]);
    }
  }
  std::string s;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const auto& g = groups[k];
    if (!s.empty()) s += "; ";
    s += cat(g.size() == 1 ? "rank " : "ranks ", g.size() == 1 ? std::to_string(g[0]) : rank_list(g), sep, order[k]);
  }
  return s;
}
inline std::string by_rank(const std::vector<std::string>& what) {
  std::vector<int> ranks(what.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  return by_rank(ranks, what);
}

}  // namespace gradsync::impl
