// What the runtime tests over the small RAG set share: its cases (a question and its
// documents), the wait for a request's chunks to be written back, requests run all at
// once, and an SSD chunk file damaged inside one layer (its checksum then fails that
// layer's read).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "blend/rag_prompt.h"

namespace bs::testing {

struct RagCase {
  std::string question;
  std::vector<std::string> documents;
};

// The first `n` cases of tests/data/rag_qa_small.jsonl, `docs` documents each.
inline std::vector<RagCase> rag_cases(int n, int docs = 3) {
  std::ifstream in(std::string(BLENDSERVE_FIXTURES) + "/../data/rag_qa_small.jsonl");
  std::vector<RagCase> out;
  std::string line;
  while (static_cast<int>(out.size()) < n && std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    RagCase c;
    c.question = j.at("question").get<std::string>();
    for (int i = 0; i < docs; ++i) c.documents.push_back(j.at("documents").at(i).get<std::string>());
    out.push_back(std::move(c));
  }
  return out;
}

// Write-back happens after the first token, in the background: waits (at most 120 s)
// until every chunk of the request is stored as computed alone (a provisional entry,
// the request's own rows stored at once, does not count: actors/runtime/chunk_flights.h).
inline void wait_stored(Runtime& rt, const RuntimeRequest& req) {
  auto& ctx = rt.context();
  const auto prompt = assemble_rag_prompt(ctx.model->tokenizer(), ctx.model->chat_template(), req.messages, req.documents);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto stored = [&] {
    for (const auto& c : prompt.chunks) {
      const ChunkKey key = ctx.engine->chunk_key(c);
      if (!ctx.tiered->contains(key) || ctx.flights.provisional(key)) return false;
    }
    return true;
  };
  while (!stored() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(stored()) << "write-back did not store the request's chunks";
}

// Submits every request at once and waits (each at most `bound`) for their results,
// in the order given; a request that did not end in time fails the test.
inline std::vector<RequestResult> run_together(Runtime& rt, const std::vector<RuntimeRequest>& reqs,
                                               std::chrono::seconds bound = std::chrono::seconds(120)) {
  std::vector<std::promise<RequestResult>> done(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestCallbacks cb;
    cb.on_done = [&done, i](const RequestResult& res) { done[i].set_value(res); };
    rt.submit(reqs[i], std::move(cb));
  }
  std::vector<RequestResult> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto fut = done[i].get_future();
    if (fut.wait_for(bound) != std::future_status::ready) {
      ADD_FAILURE() << "request " << i << " did not end within " << bound.count() << " s";
      // on_done would still write into `done`: wait for it rather than leave it dangling.
      fut.wait();
    }
    out.push_back(fut.get());
  }
  return out;
}

// The largest .bskv file in `dir` (a document chunk: the prefix is short); empty if none.
inline std::filesystem::path largest_chunk_file(const std::filesystem::path& dir) {
  std::filesystem::path largest;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".bskv" && (largest.empty() || std::filesystem::file_size(e.path()) >
                                                                   std::filesystem::file_size(largest)))
      largest = e.path();
  return largest;
}

// Flips a byte inside `layer`'s K data of a layer-major SSD chunk file of n_layers
// (a 4096-byte header this chunk's tokens fit in, then n_layers equal spans).
inline void flip_byte_in_layer(const std::filesystem::path& file, int layer, int n_layers) {
  const auto size = static_cast<std::streamoff>(std::filesystem::file_size(file));
  ASSERT_EQ((size - 4096) % n_layers, 0);
  const std::streamoff at = 4096 + layer * ((size - 4096) / n_layers) + 1000;
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  char b = 0;
  f.seekg(at);
  f.read(&b, 1);
  b ^= 0x5a;
  f.seekp(at);
  f.write(&b, 1);
  ASSERT_TRUE(f.good());
}

}  // namespace bs::testing
