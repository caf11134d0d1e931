// tokenizer_bench: encode throughput of a tokenizer on a corpus of JSON-string lines
// (tests/tokenizer/corpus.jsonl), repeated to a given size, one text at a time (the way the
// trainer tokenizes samples), on one thread.
//
//   tokenizer_bench TOKENIZER_DIR|byte CORPUS.jsonl MEGABYTES
//
// Prints one JSON line: {"tokenizer": ..., "bytes": N, "tokens": T, "seconds": S,
// "mb_per_s": R, "load_seconds": L}. bench/tokenizer/run.sh compares it with the JavaScript
// reference.
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer_loader.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: tokenizer_bench TOKENIZER_DIR|byte CORPUS.jsonl MEGABYTES\n";
    return 2;
  }
  using SteadyClock = std::chrono::steady_clock;
  const auto t_load = SteadyClock::now();
  auto tok = sftctl::LoadTokenizer(argv[1]);
  if (!tok.ok()) {
    std::cerr << "tokenizer_bench: " << tok.status().ToString() << "\n";
    return 1;
  }
  const double load_seconds = std::chrono::duration<double>(SteadyClock::now() - t_load).count();

  std::vector<std::string> corpus;
  std::ifstream in(argv[2]);
  if (!in) {
    std::cerr << "tokenizer_bench: cannot open " << argv[2] << "\n";
    return 1;
  }
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    std::string text = nlohmann::json::parse(line).get<std::string>();
    if (!text.empty()) corpus.push_back(std::move(text));
  }
  if (corpus.empty()) {
    std::cerr << "tokenizer_bench: empty corpus\n";
    return 1;
  }
  // Same repetition as tests/tokenizer/reference.js bench.
  const double target = std::stod(argv[3]) * 1e6;
  std::vector<const std::string*> texts;
  size_t bytes = 0;
  for (size_t i = 0; static_cast<double>(bytes) < target; i = (i + 1) % corpus.size()) {
    texts.push_back(&corpus[i]);
    bytes += corpus[i].size();
  }
  for (size_t i = 0; i < texts.size() && i < 2000; ++i) (void)(*tok)->Encode(*texts[i]);  // warm-up

  size_t tokens = 0;
  const auto t0 = SteadyClock::now();
  for (const std::string* t : texts) tokens += (*tok)->Encode(*t).size();
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  nlohmann::json out = {{"tokenizer", (*tok)->name()},
                        {"bytes", bytes},
                        {"tokens", tokens},
                        {"seconds", seconds},
                        {"mb_per_s", bytes / 1e6 / seconds},
                        {"load_seconds", load_seconds}};
  std::cout << out.dump() << "\n";
  return 0;
}
