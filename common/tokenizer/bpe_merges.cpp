#include "common/tokenizer/bpe_merges.h"

#include <algorithm>
#include <functional>
#include <queue>

namespace sftctl {
namespace bpe_internal {
namespace {

constexpr size_t kMaxLinearMergeSymbols = 96;

// Few symbols: keep them in an array with the rank of each adjacent pair, and merge the
// lowest-ranked (leftmost on ties) pair until none merges.
// REQUIRES: n <= kMaxLinearMergeSymbols; `sym` is merged in place.
void MergeFewSymbols(int32_t* sym, size_t n, const MergeTable& merges, std::vector<int32_t>* out) {
  int32_t rank[kMaxLinearMergeSymbols];
  int32_t merged[kMaxLinearMergeSymbols] = {};
  size_t count = n;
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = merges.Find(sym[i], sym[i + 1], &merged[i]);
  while (count > 1) {
    size_t best = 0;
    int32_t best_rank = rank[0];
    for (size_t i = 1; i + 1 < count; ++i) {
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    sym[best] = merged[best];
    // Remove symbol best+1 and pair best.
    for (size_t i = best + 1; i + 1 < count; ++i) sym[i] = sym[i + 1];
    for (size_t i = best; i + 2 < count; ++i) {
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --count;
    if (best > 0) rank[best - 1] = merges.Find(sym[best - 1], sym[best], &merged[best - 1]);
    if (best + 1 < count) rank[best] = merges.Find(sym[best], sym[best + 1], &merged[best]);
  }
  out->insert(out->end(), sym, sym + count);
}

// Many symbols: doubly linked list + priority queue keyed by (rank, position).
void MergeManySymbols(const int32_t* symbols, size_t n, const MergeTable& merges, std::vector<int32_t>* out) {
  struct Node {
    int32_t id;
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i) {
    nodes[i] = Node{symbols[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int32_t pos) {
    const int32_t next = nodes[pos].next;
    if (next < 0) return;
    int32_t m = 0;
    const int32_t r = merges.Find(nodes[pos].id, nodes[next].id, &m);
    if (r != INT32_MAX) queue.push(Candidate{r, pos, nodes[pos].id, nodes[next].id, m});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Node& left = nodes[c.pos];
    // Stale (a dead node has id -1, and candidates only join ids >= 0).
    if (left.id != c.left_id || left.next < 0 || nodes[left.next].id != c.right_id) continue;
    const int32_t right = left.next;
    left.id = c.merged;
    left.next = nodes[right].next;
    if (left.next >= 0) nodes[left.next].prev = c.pos;
    nodes[right].id = -1;  // dead
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) out->push_back(nodes[i].id);
}

}  // namespace

void MergeWord(std::string_view word, const std::array<int32_t, 256>& byte_ids, const MergeTable& merges,
               std::vector<int32_t>* out) {
  const size_t n = word.size();
  if (n <= kMaxLinearMergeSymbols) {
    int32_t sym[kMaxLinearMergeSymbols];
    for (size_t i = 0; i < n; ++i) sym[i] = byte_ids[static_cast<unsigned char>(word[i])];
    MergeFewSymbols(sym, n, merges, out);
  } else {
    std::vector<int32_t> sym(n);
    for (size_t i = 0; i < n; ++i) sym[i] = byte_ids[static_cast<unsigned char>(word[i])];
    MergeManySymbols(sym.data(), n, merges, out);
  }
}

void MergeSymbols(const int32_t* symbols, size_t n, const MergeTable& merges, std::vector<int32_t>* out) {
  if (n <= kMaxLinearMergeSymbols) {
    int32_t sym[kMaxLinearMergeSymbols];
    std::copy(symbols, symbols + n, sym);
    MergeFewSymbols(sym, n, merges, out);
  } else {
    MergeManySymbols(symbols, n, merges, out);
  }
}

}  // namespace bpe_internal
}  // namespace sftctl
