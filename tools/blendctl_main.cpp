// blendctl: benchmarks, evaluation and (later) the inspection console.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "tools/bench.h"

int main(int argc, char** argv) {
  CLI::App app{"blendctl: blendserve benchmarks and tools"};
  app.require_subcommand(1);
  bs::tools::BenchOptions opt;
  opt.model_path = std::getenv("BLENDSERVE_MODEL") ? std::getenv("BLENDSERVE_MODEL") : BLENDSERVE_DEFAULT_MODEL;
  app.add_option("--model", opt.model_path, "GGUF model file");

  auto* bench = app.add_subcommand("bench", "Benchmarks (JSON lines on stdout)");
  bench->require_subcommand(1);
  auto* prefill = bench->add_subcommand("prefill", "Full prefill and decode throughput, GEMM throughput");
  std::string precision = "bf16";
  prefill->add_option("--precision", precision)->check(CLI::IsMember({"bf16", "f32"}));
  prefill->add_option("--lengths", opt.prefill_lengths, "Prompt lengths to prefill");
  prefill->add_option("--repeats", opt.repeats)->check(CLI::Range(1, 100));
  prefill->add_option("--decode-context", opt.decode_context)->check(CLI::Range(1, 8000));
  prefill->add_option("--decode-tokens", opt.decode_tokens)->check(CLI::Range(1, 4096));

  CLI11_PARSE(app, argc, argv);
  opt.precision = precision == "f32" ? bs::kernels::Precision::F32 : bs::kernels::Precision::BF16;
  try {
    if (prefill->parsed()) return bs::tools::bench_prefill(opt);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
