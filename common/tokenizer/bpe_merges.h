// The BPE model's merges: the table (left id, right id) -> (rank, merged id), and the merge loop
// that turns the symbols of one pre-tokenized word (its bytes for byte-level BPE, its characters
// for SentencePiece-style BPE: bpe_byte_fallback.h) into token ids.
//
// Thread safety: a MergeTable is immutable after loading; Find and MergeWord may be called
// concurrently.
#pragma once

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace sftctl {
namespace bpe_internal {

// Open addressing on uint64 keys; Find is inline for the merge loop.
class MergeTable {
 public:
  explicit MergeTable(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Later entries overwrite earlier ones, as in both reference implementations.
  void Insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t key = Key(a, b);
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Slot{key, rank, merged};
        return;
      }
    }
  }
  // Returns the rank (INT32_MAX when the pair does not merge) and sets *merged. A negative id
  // (a character missing from the vocabulary) never merges.
  int32_t Find(int32_t a, int32_t b, int32_t* merged) const {
    if ((a | b) < 0) return INT32_MAX;
    const uint64_t key = Key(a, b);
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *merged = s.merged;
        return s.rank;
      }
      if (s.key == kEmpty) return INT32_MAX;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  static uint64_t Hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Appends the ids of `word`: its bytes (each the id byte_ids gives it) merged pair by pair,
// the lowest-ranked pair first (leftmost on ties), until no adjacent pair merges.
// REQUIRES: every byte of `word` has an id in byte_ids.
void MergeWord(std::string_view word, const std::array<int32_t, 256>& byte_ids, const MergeTable& merges,
               std::vector<int32_t>* out);

// Appends `symbols` (ids; negative ones never merge) merged pair by pair as MergeWord does.
void MergeSymbols(const int32_t* symbols, size_t n, const MergeTable& merges, std::vector<int32_t>* out);

}  // namespace bpe_internal
}  // namespace sftctl
