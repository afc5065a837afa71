// Every CUDA op against the CPU reference backend on random inputs of awkward sizes
// (ggml's test-backend-ops habit), plus the RAII owners and the error messages. Label
// "cuda": without a GPU (or a driver) the binary prints why and exits 77, which CTest
// reports as skipped, never as passed. Not named test_* so the unit-test glob leaves it
// alone: it links the CUDA library and has its own main.
// The decode and blend ops are in cuda_test_ops_decode.cpp (the same binary; this
// file brings its main).
#include "tests/cuda_ops_fixture.h"

namespace bs::kernels::cuda {
namespace {

using namespace ops_test;

TEST_F(CudaOps, RmsnormMatchesTheReference) {
  for (int64_t dim : {576, 17, 64, 1000, 4097}) {
    for (int64_t n : {1, 7, 33}) {
      auto x = random_vec(n * dim, 1), w = random_vec(dim, 2);
      std::vector<float> want(n * dim);
      ref->rmsnorm(x.data(), w.data(), want.data(), n, dim, 1e-5f);
      auto dx = dev.up(x), dw = dev.up(w);
      DeviceAllocation dout(want.size() * sizeof(float));
      rmsnorm(dx.as<float>(), dw.as<float>(), dout.as<float>(), n, dim, 1e-5f, dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dout), want), 1e-5) << "n " << n << " dim " << dim;
    }
  }
}

TEST_F(CudaOps, SwigluMatchesTheReference) {
  for (int64_t ff : {1536, 17, 1}) {
    for (int64_t n : {1, 5, 129}) {
      auto gu = random_vec(n * 2 * ff, 3);
      std::vector<float> want(n * ff);
      ref->swiglu(gu.data(), want.data(), n, ff);
      auto dgu = dev.up(gu);
      DeviceAllocation dout(want.size() * sizeof(float));
      swiglu(dgu.as<float>(), dout.as<float>(), n, ff, dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dout), want), 1e-5) << "n " << n << " ff " << ff;
    }
  }
}

TEST_F(CudaOps, ResidualAddIsBitIdenticalToTheReference) {
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{576} * 129 + 3}) {
    auto y = random_vec(count, 4), x = random_vec(count, 5);
    auto dy = dev.up(y), dx = dev.up(x);
    ref->add(y.data(), x.data(), count);
    residual_add(dy.as<float>(), dx.as<float>(), count, dev.stream.get());
    EXPECT_EQ(dev.down(dy), y) << "count " << count;
  }
}

TEST_F(CudaOps, SplitQkvAndGatherRowsAreBitIdenticalToTheReference) {
  struct Shape { int64_t n, q_dim, kv_dim; };
  for (auto sh : {Shape{1, 576, 192}, Shape{7, 64, 32}, Shape{130, 96, 1}}) {
    const int64_t width = sh.q_dim + 2 * sh.kv_dim;
    auto qkv = random_vec(sh.n * width, 6);
    std::vector<float> q(sh.n * sh.q_dim), k(sh.n * sh.kv_dim), v(sh.n * sh.kv_dim);
    ref->split_qkv(qkv.data(), q.data(), k.data(), v.data(), sh.n, sh.q_dim, sh.kv_dim);
    auto dqkv = dev.up(qkv);
    DeviceAllocation dq(q.size() * 4), dk(k.size() * 4), dv(v.size() * 4);
    split_qkv(dqkv.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), sh.n, sh.q_dim, sh.kv_dim,
              dev.stream.get());
    EXPECT_EQ(dev.down(dq), q);
    EXPECT_EQ(dev.down(dk), k);
    EXPECT_EQ(dev.down(dv), v);

    std::vector<int32_t> rows;  // out of order, repeated, the last row
    for (int64_t i = 0; i < sh.n; i += 3) rows.push_back(static_cast<int32_t>(sh.n - 1 - i));
    rows.push_back(0);
    rows.push_back(0);
    const int64_t m = static_cast<int64_t>(rows.size());
    std::vector<float> want(m * width);
    ref->gather_rows(qkv.data(), rows.data(), want.data(), m, width);
    DeviceAllocation drows(rows.size() * sizeof(int32_t)), dout(want.size() * 4);
    BS_CUDA_CHECK(cudaMemcpyAsync(drows.get(), rows.data(), drows.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
    gather_rows(dqkv.as<float>(), drows.as<int32_t>(), dout.as<float>(), m, width, dev.stream.get());
    EXPECT_EQ(dev.down(dout), want);
  }
}

// Every stored type the device decodes, from random bytes (all bit patterns: NaN and
// subnormal halves included), bit-exact to the CPU's dequantization. A NaN equals any
// NaN: arithmetic on one (Q4_1's q * d + m with m a NaN) gives the GPU's canonical NaN
// (0x7fffffff) where x86 keeps the operand's payload (seen on an H200: type 3, one row).
TEST_F(CudaOps, EmbedIsBitExactToTheCpuDequantization) {
  const int64_t vocab = 37, dim = 96, n = 9;
  std::mt19937 rng(7);
  std::vector<int32_t> ids = {36, 0, 5, 5, 17, 36, 1, 2, 30};
  for (TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                          TensorType::Q4_1}) {
    const int64_t row_bytes = type_row_bytes(type, dim);
    std::vector<uint8_t> table(static_cast<size_t>(vocab * row_bytes));
    for (auto& b : table) b = static_cast<uint8_t>(rng());
    if (type == TensorType::F32)  // finite floats (a NaN's payload is not what this tests)
      for (int64_t i = 0; i < vocab * dim; ++i) {
        const float f = static_cast<float>(static_cast<int32_t>(rng())) * 1e-6f;
        std::memcpy(&table[i * 4], &f, 4);
      }
    std::vector<float> want(n * dim);
    for (int64_t t = 0; t < n; ++t) dequantize_row(type, &table[ids[t] * row_bytes], &want[t * dim], dim);
    DeviceAllocation dtable(table.size()), dids(ids.size() * sizeof(int32_t)), dout(want.size() * 4);
    BS_CUDA_CHECK(cudaMemcpyAsync(dtable.get(), table.data(), table.size(), cudaMemcpyHostToDevice, dev.stream.get()));
    BS_CUDA_CHECK(cudaMemcpyAsync(dids.get(), ids.data(), dids.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
    embed(type, dtable.get(), dids.as<int32_t>(), dout.as<float>(), n, dim, vocab, dev.stream.get());
    const auto got = dev.down(dout);
    int64_t differ = 0, nans = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        ++nans;
        differ += !std::isnan(got[i]);
      } else {
        differ += std::memcmp(&got[i], &want[i], 4) != 0;
      }
    }
    EXPECT_EQ(differ, 0) << "type " << static_cast<int>(type) << ": " << differ << " of " << want.size()
                         << " elements differ (" << nans << " NaN in the CPU's)";
  }
  EXPECT_THROW(embed(TensorType::Q4_0, nullptr, nullptr, nullptr, 1, 48, vocab, dev.stream.get()),
               std::invalid_argument);
}

// Ids out of range read nothing: their rows are NaN, the others right, and the check
// kernel flags the first op that saw one (the backend's report at its next wait).
TEST_F(CudaOps, OutOfRangeIdsReadNothingAndAreFlagged) {
  const int64_t vocab = 10, dim = 64;
  const auto table = random_vec(static_cast<size_t>(vocab * dim), 8);
  const std::vector<int32_t> ids = {3, -1, 10, 9};
  auto dtable = dev.up(table);
  DeviceAllocation dids(ids.size() * sizeof(int32_t)), dout(ids.size() * dim * 4), flag(sizeof(int32_t));
  BS_CUDA_CHECK(cudaMemcpyAsync(dids.get(), ids.data(), dids.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
  BS_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int32_t), dev.stream.get()));
  flag_out_of_range(dids.as<int32_t>(), 4, vocab, 5, flag.as<int32_t>(), dev.stream.get());
  flag_out_of_range(dids.as<int32_t>(), 4, vocab, 6, flag.as<int32_t>(), dev.stream.get());  // the first stays
  embed(TensorType::F32, dtable.get(), dids.as<int32_t>(), dout.as<float>(), 4, dim, vocab, dev.stream.get());
  const auto got = dev.down(dout);
  int32_t code = 0;
  BS_CUDA_CHECK(cudaMemcpy(&code, flag.get(), sizeof code, cudaMemcpyDeviceToHost));
  EXPECT_EQ(code, 5);
  for (int64_t c = 0; c < dim; ++c) {
    EXPECT_EQ(got[static_cast<size_t>(c)], table[static_cast<size_t>(3 * dim + c)]);
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(dim + c)]));
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(2 * dim + c)]));
    EXPECT_EQ(got[static_cast<size_t>(3 * dim + c)], table[static_cast<size_t>(9 * dim + c)]);
  }
  const std::vector<int32_t> fine = {0, 9};
  BS_CUDA_CHECK(cudaMemcpyAsync(dids.get(), fine.data(), 8, cudaMemcpyHostToDevice, dev.stream.get()));
  BS_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int32_t), dev.stream.get()));
  flag_out_of_range(dids.as<int32_t>(), 2, vocab, 5, flag.as<int32_t>(), dev.stream.get());
  dev.stream.synchronize();
  BS_CUDA_CHECK(cudaMemcpy(&code, flag.get(), sizeof code, cudaMemcpyDeviceToHost));
  EXPECT_EQ(code, 0);
}

// Both pair layouts, negative and large positions (delta-RoPE moves chunks backwards;
// contexts reach thousands), scaled inverse frequencies: the device rotation with the
// (cos, sin) rows the backend computes in double, against the reference's double math.
TEST_F(CudaOps, RopeMatchesTheReferenceBothStylesAnyPosition) {
  const int64_t heads = 3, head_dim = 64, half = head_dim / 2;
  const std::vector<int32_t> pos = {0, 1, -7, 8191, -3000, 511, 12, 4096};
  const int64_t n = static_cast<int64_t>(pos.size());
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
    RopeTable table;
    table.style = style;
    table.head_dim = static_cast<int>(head_dim);
    for (int64_t i = 0; i < half; ++i)
      table.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / head_dim) * (i < half / 2 ? 1.0 : 0.125)));
    auto prepared = ref->prepare_rope(table);
    std::vector<float> cos_sin(n * half * 2);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(pos[t]) * table.inv_freq[i];
        cos_sin[(t * half + i) * 2] = static_cast<float>(std::cos(a));
        cos_sin[(t * half + i) * 2 + 1] = static_cast<float>(std::sin(a));
      }
    auto x = random_vec(n * heads * head_dim, 8);
    auto dx = dev.up(x), dcs = dev.up(cos_sin);
    ref->rope(x.data(), pos.data(), n, heads, *prepared);
    rope(dx.as<float>(), dcs.as<float>(), n, heads, head_dim, style == RopeStyle::Interleaved, dev.stream.get());
    EXPECT_LT(rel_max_err(dev.down(dx), x), 1e-5) << "style " << static_cast<int>(style);
  }
}


// Prefill (every row), the blend's selected rows (a subset, out of order), and decode
// (one row at the end), over each KV dtype with GQA, against the reference.
TEST_F(CudaOps, PagedAttentionMatchesTheReference) {
  const int64_t kv_heads = 3, q_heads = 9, head_dim = 64, rows = 150;
  auto k = random_vec(kv_heads * rows * head_dim, 11), v = random_vec(kv_heads * rows * head_dim, 12);
  for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    auto host = test::make_paged(k, v, kv_heads, rows, head_dim, rows, 5, 13, 3, dtype);
    auto d = upload_paged(dev, host);
    std::vector<std::vector<int32_t>> cases = {{}, {149, 3, 77, 0, 31, 32}, {149}};
    for (int32_t p = 0; p < rows; ++p) cases[0].push_back(p);
    for (const auto& qpos : cases) {
      const int64_t n = static_cast<int64_t>(qpos.size());
      auto q = random_vec(n * q_heads * head_dim, 14);
      std::vector<float> want(q.size());
      ref->attention(q.data(), qpos.data(), host.view, want.data(), n, q_heads, rows, 0.125f, Precision::F32);
      auto dq = dev.up(q);
      DeviceAllocation dpos(qpos.size() * sizeof(int32_t)), dout(want.size() * 4);
      BS_CUDA_CHECK(cudaMemcpyAsync(dpos.get(), qpos.data(), dpos.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
      attention(dq.as<float>(), dpos.as<int32_t>(), d.view, dout.as<float>(), n, q_heads, rows, 0.125f,
                dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dout), want), 1e-4) << "dtype " << static_cast<int>(dtype) << " n " << n;
    }
  }
}

// Rows stored on the device land where the CPU puts them, rounded the same way (finite
// values: bit-exact), K only when V is null.
TEST_F(CudaOps, StoreKvWritesTheCpusBytes) {
  const int64_t kv_heads = 3, head_dim = 64, rows = 70, n = 5;
  const std::vector<int32_t> pos = {69, 0, 33, 32, 5};
  for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    std::vector<float> zeros(kv_heads * rows * head_dim, 0.0f);
    auto host = test::make_paged(zeros, zeros, kv_heads, rows, head_dim, rows, 4, 15, 2, dtype);
    auto d = upload_paged(dev, host);
    auto kr = random_vec(n * kv_heads * head_dim, 16), vr = random_vec(n * kv_heads * head_dim, 17);
    ref->store_kv(host.view, pos.data(), kr.data(), nullptr, 3);  // K only for the first 3
    ref->store_kv(host.view, pos.data() + 3, kr.data() + 3 * kv_heads * head_dim,
                  vr.data() + 3 * kv_heads * head_dim, 2);
    auto dk = dev.up(kr), dv = dev.up(vr);
    DeviceAllocation dpos(pos.size() * sizeof(int32_t));
    BS_CUDA_CHECK(cudaMemcpyAsync(dpos.get(), pos.data(), dpos.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
    store_kv(d.view, dpos.as<int32_t>(), dk.as<float>(), nullptr, 3, dev.stream.get());
    store_kv(d.view, dpos.as<int32_t>() + 3, dk.as<float>() + 3 * kv_heads * head_dim,
             dv.as<float>() + 3 * kv_heads * head_dim, 2, dev.stream.get());
    std::vector<std::byte> gk(host.k.size()), gv(host.v.size());
    BS_CUDA_CHECK(cudaMemcpyAsync(gk.data(), d.k.get(), gk.size(), cudaMemcpyDeviceToHost, dev.stream.get()));
    BS_CUDA_CHECK(cudaMemcpyAsync(gv.data(), d.v.get(), gv.size(), cudaMemcpyDeviceToHost, dev.stream.get()));
    dev.stream.synchronize();
    EXPECT_TRUE(gk == host.k) << "dtype " << static_cast<int>(dtype);
    EXPECT_TRUE(gv == host.v) << "dtype " << static_cast<int>(dtype);
  }
}

// Weights of every stored type dequantized to bf16 on the device, then cuBLAS in bf16
// with fp32 accumulation, against the reference's exact product: within bf16's rounding
// of weights and activations (the CPU's bf16 GEMM bound, 2e-2 relative), bias added.
TEST_F(CudaOps, LinearFromEveryStoredTypeMatchesTheReferenceWithinBf16) {
  const int64_t out = 70, in = 96;
  std::mt19937 rng(9);
  CublasHandle cublas(dev.stream.get());
  DeviceAllocation scratch;
  for (TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                          TensorType::Q4_1}) {
    const int64_t row_bytes = type_row_bytes(type, in);
    std::vector<uint8_t> raw(static_cast<size_t>(out * row_bytes));
    const auto wf = random_vec(out * in, 10);
    if (type == TensorType::F32) {
      std::memcpy(raw.data(), wf.data(), raw.size());
    } else if (type == TensorType::F16 || type == TensorType::BF16) {
      for (int64_t i = 0; i < out * in; ++i) {
        const uint16_t h = type == TensorType::F16 ? fp32_to_fp16(wf[i]) : fp32_to_bf16(wf[i]);
        std::memcpy(&raw[i * 2], &h, 2);
      }
    } else {  // random quants under sane scales
      const int64_t bbytes = type == TensorType::Q8_0 ? 34 : type == TensorType::Q4_0 ? 18 : 20;
      for (auto& b : raw) b = static_cast<uint8_t>(rng());
      for (int64_t blk = 0; blk < out * in / 32; ++blk) {
        const uint16_t d = fp32_to_fp16(0.01f + 0.001f * static_cast<float>(blk % 7));
        const uint16_t m = fp32_to_fp16(-0.05f);
        std::memcpy(&raw[blk * bbytes], &d, 2);
        if (type == TensorType::Q4_1) std::memcpy(&raw[blk * bbytes + 2], &m, 2);
      }
    }
    WeightView view{type, raw.data(), out, in};
    auto pr = ref->prepare(view, Precision::F32);
    DeviceAllocation stored(raw.size());
    BS_CUDA_CHECK(cudaMemcpyAsync(stored.get(), raw.data(), raw.size(), cudaMemcpyHostToDevice, dev.stream.get()));
    const Bf16Weights w = weights_to_bf16(type, stored.get(), out, in, dev.stream.get());
    for (int64_t n : {1, 8, 129}) {
      auto x = random_vec(n * in, 11);
      auto bias = random_vec(out, 12);
      std::vector<float> want(n * out);
      ref->linear(*pr, x.data(), want.data(), n, bias.data());
      auto dx = dev.up(x), dbias = dev.up(bias);
      DeviceAllocation dy(want.size() * 4);
      linear(cublas, w, dx.as<float>(), dy.as<float>(), n, dbias.as<float>(), scratch, dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dy), want), 2e-2) << "type " << static_cast<int>(type) << " n " << n;
    }
  }
}


TEST(CudaResources, EventsOrderStreamsAndErrorsNameTheCall) {
  CudaStream a, b;
  CudaEvent done;
  const std::vector<float> ones(1 << 20, 1.0f);
  DeviceAllocation x(ones.size() * sizeof(float)), y(ones.size() * sizeof(float));
  BS_CUDA_CHECK(cudaMemcpyAsync(x.get(), ones.data(), x.bytes(), cudaMemcpyHostToDevice, a.get()));
  BS_CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.bytes(), a.get()));
  done.record(a.get());
  done.wait_on(b.get());  // b's add sees a's copies
  residual_add(y.as<float>(), x.as<float>(), static_cast<int64_t>(ones.size()), b.get());
  std::vector<float> back(ones.size());
  BS_CUDA_CHECK(cudaMemcpyAsync(back.data(), y.get(), y.bytes(), cudaMemcpyDeviceToHost, b.get()));
  b.synchronize();
  EXPECT_EQ(back, ones);
  DeviceAllocation moved = std::move(x);
  EXPECT_EQ(x.get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
  try {
    DeviceAllocation huge(size_t{1} << 62);
    FAIL() << "allocating 4 EiB succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device 0"), std::string::npos) << e.what();
  }
}

// The backend's bounded host waits (device_waits.h): a stream kept busy past the limit
// (a host function that sleeps, enqueued on it) is given up on with DeviceLost naming
// the wait and the limit; every later wait then throws at once, even on finished work.
TEST(CudaResources, AWaitPastTheLimitMarksTheDeviceLost) {
  CudaStream busy, idle;
  CudaEvent idle_done;
  DeviceWaits waits(0, "test GPU", std::chrono::milliseconds(100));
  idle_done.record(idle.get());
  waits.for_event(idle_done.get(), "idle work");  // finished work: returns
  EXPECT_FALSE(waits.lost());
  BS_CUDA_CHECK(cudaLaunchHostFunc(
      busy.get(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); }, nullptr));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    waits.for_stream(busy.get(), "a stuck step");
    FAIL() << "a wait on a stream busy for 1.5 s returned within a 100 ms limit";
  } catch (const DeviceLost& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a stuck step did not finish within 0.1 s"), std::string::npos) << what;
    EXPECT_NE(what.find("device.wait_timeout"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1400));
  EXPECT_TRUE(waits.lost());
  EXPECT_THROW(waits.for_event(idle_done.get(), "idle work"), DeviceLost);
  busy.synchronize();  // the host function ends; nothing left running at teardown
}

}  // namespace
}  // namespace bs::kernels::cuda

int main(int argc, char** argv) {
  const int devices = bs::kernels::cuda::device_count();
  if (devices == 0) {
    std::printf("no CUDA device (or no driver): the CUDA op tests are skipped\n");
    return 77;
  }
  for (int d = 0; d < devices; ++d)
    std::printf("CUDA device %d: %s\n", d, bs::kernels::cuda::device_description(d).c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
