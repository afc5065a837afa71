// The paged KV cache (model/kv_cache.h): pages come from the pool and go back to it
// exactly once, however a cache ends; rows land where the page table says, also
// across page boundaries and in pages handed out out of order; admission
// reservations are all or nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/dequant.h"
#include "model/kv_cache.h"

namespace bs {
namespace {

constexpr int kLayers = 3, kHeads = 2, kHeadDim = 16;

std::vector<float> iota_rows(int64_t rows, float start) {
  std::vector<float> v(static_cast<size_t>(rows * kHeadDim));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(KvPagePool, CachesTakePagesAndGiveThemBackExactlyOnce) {
  auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 10, /*page_shift=*/4);  // 16 positions a page
  EXPECT_EQ(pool->page_positions(), 16);
  EXPECT_EQ(pool->pages_for(1), 1);
  EXPECT_EQ(pool->pages_for(16), 1);
  EXPECT_EQ(pool->pages_for(17), 2);
  EXPECT_EQ(pool->page_bytes(), 2 * kLayers * kHeads * 16 * kHeadDim * 4);
  {
    KvCache a = pool->make_cache(40);  // 3 pages
    EXPECT_EQ(a.pages().size(), 3u);
    EXPECT_EQ(a.capacity, 40);
    EXPECT_EQ(pool->free_pages(), 7);
    KvCache b = pool->make_cache(16 * 7);  // the other 7
    EXPECT_EQ(pool->free_pages(), 0);
    EXPECT_FALSE(pool->try_make_cache(1).has_value());
    EXPECT_THROW(pool->make_cache(1), std::length_error);
    std::set<int32_t> all(a.pages().begin(), a.pages().end());
    all.insert(b.pages().begin(), b.pages().end());
    EXPECT_EQ(all.size(), 10u) << "no page handed out twice";
    // Moved: the pages go with the cache, and back once.
    KvCache c = std::move(a);
    EXPECT_EQ(a.capacity, 0);
    EXPECT_TRUE(a.pages().empty());
    a = std::move(c);
    a.reset();
    a.reset();
    EXPECT_EQ(pool->free_pages(), 3);
    b = pool->make_cache(16);  // the new cache takes its page before b's 7 go back
    EXPECT_EQ(pool->free_pages(), 3 - 1 + 7);
  }
  EXPECT_EQ(pool->free_pages(), 10);
}

TEST(KvPagePool, ACacheOutlivesItsPoolHandle) {
  KvCache cache;
  std::weak_ptr<KvPagePool> weak;
  {
    auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 2, 4);
    weak = pool;
    cache = pool->make_cache(20);
  }
  EXPECT_FALSE(weak.expired()) << "the cache keeps its pool";
  const auto rows = iota_rows(20, 1.0f);
  cache.write_rows(2, 1, 0, 20, rows.data(), rows.data());
  cache.reset();
  EXPECT_TRUE(weak.expired());
}

TEST(KvPagePool, RowsLandWhereThePageTableSaysAcrossPageBoundaries) {
  auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 12, 3);  // 8 positions a page
  // Fragment the pool: the second cache's pages are not in order.
  KvCache filler1 = pool->make_cache(16), gap1 = pool->make_cache(8), filler2 = pool->make_cache(8);
  KvCache gap2 = pool->make_cache(16);
  gap1.reset();
  gap2.reset();  // on top of the free stack: the next cache starts with gap2's pages, then gap1's
  KvCache cache = pool->make_cache(29);  // 4 pages
  std::vector<int32_t> sorted = cache.pages();
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(sorted, cache.pages()) << "the test wants pages out of order";
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h) {
      const auto k = iota_rows(29, 1000.0f * (l * kHeads + h));
      const auto v = iota_rows(29, -1000.0f * (l * kHeads + h) - 1);
      cache.write_rows(l, h, 0, 29, k.data(), v.data());
    }
  // Through k_at, the kernels' view and read_rows, every row reads back.
  for (int l = 0; l < kLayers; ++l) {
    const kernels::KvView view = cache.view(l);
    EXPECT_EQ(view.capacity, 29);
    EXPECT_EQ(view.page_positions(), 8);
    for (int h = 0; h < kHeads; ++h) {
      const auto k = iota_rows(29, 1000.0f * (l * kHeads + h));
      const auto v = iota_rows(29, -1000.0f * (l * kHeads + h) - 1);
      for (int64_t p = 0; p < 29; ++p) {
        for (int d = 0; d < kHeadDim; ++d) {
          ASSERT_EQ(cache.k_at(l, h, p)[d], k[p * kHeadDim + d]) << l << " " << h << " " << p;
        }
        std::vector<float> vk(kHeadDim), vv(kHeadDim);
        view.read_k_row(h, p, vk.data());
        view.read_v_row(h, p, vv.data());
        ASSERT_TRUE(std::equal(vk.begin(), vk.end(), k.begin() + p * kHeadDim));
        ASSERT_TRUE(std::equal(vv.begin(), vv.end(), v.begin() + p * kHeadDim));
      }
      // A part that starts and ends inside pages.
      std::vector<float> rk(11 * kHeadDim), rv(rk.size());
      cache.read_rows(l, h, 5, 11, rk.data(), rv.data());
      EXPECT_TRUE(std::equal(rk.begin(), rk.end(), k.begin() + 5 * kHeadDim));
      EXPECT_TRUE(std::equal(rv.begin(), rv.end(), v.begin() + 5 * kHeadDim));
    }
  }
  // Runs: one per page touched.
  std::vector<std::pair<int64_t, int64_t>> runs;
  cache.for_each_run(5, 20, [&](int64_t at, int64_t n) { runs.push_back({at, n}); });
  EXPECT_EQ(runs, (std::vector<std::pair<int64_t, int64_t>>{{5, 3}, {8, 8}, {16, 8}, {24, 1}}));
  // Whole layers out and in ([kv_heads, rows, head_dim]).
  std::vector<float> lk(kHeads * 29 * kHeadDim), lv(lk.size());
  cache.read_layer(1, 29, lk.data(), lv.data());
  KvCache copy = pool->make_cache(29);
  copy.write_layer(1, 29, lk.data(), lv.data());
  for (int h = 0; h < kHeads; ++h)
    for (int64_t p = 0; p < 29; ++p)
      ASSERT_EQ(0, std::memcmp(copy.k_at(1, h, p), cache.k_at(1, h, p), kHeadDim * sizeof(float)));
  EXPECT_THROW(cache.write_rows(0, 0, 20, 10, lk.data(), lv.data()), std::out_of_range);
  EXPECT_THROW(cache.read_rows(0, 0, -1, 2, lk.data(), lv.data()), std::out_of_range);
  // A block of rows of every head ([kv_heads, m, head_dim], a stored chunk's layer) that
  // starts and ends inside pages lands where per-head writes put it, and only there.
  const int64_t first = 5, m = 19;
  std::vector<float> bk(kHeads * m * kHeadDim), bv(bk.size());
  std::iota(bk.begin(), bk.end(), 5000.0f);
  std::iota(bv.begin(), bv.end(), -5000.0f);
  auto pool2 = KvPagePool::make(kLayers, kHeads, kHeadDim, 8, 3);
  KvCache by_block = pool2->make_cache(29), by_head = pool2->make_cache(29);
  for (KvCache* c : {&by_block, &by_head}) c->write_layer(2, 29, lk.data(), lv.data());
  by_block.write_block_raw(2, first, m, bk.data(), bv.data());
  for (int h = 0; h < kHeads; ++h)
    by_head.write_rows_raw(2, h, first, m, bk.data() + h * m * kHeadDim, bv.data() + h * m * kHeadDim);
  std::vector<float> gk(lk.size()), gv(lk.size()), wk(lk.size()), wv(lk.size());
  by_block.read_layer(2, 29, gk.data(), gv.data());
  by_head.read_layer(2, 29, wk.data(), wv.data());
  EXPECT_EQ(gk, wk);
  EXPECT_EQ(gv, wv);
  EXPECT_EQ(gk[(1 * 29 + first) * kHeadDim], bk[1 * m * kHeadDim]) << "head 1's first row of the block";
  EXPECT_EQ(gk[(1 * 29 + first - 1) * kHeadDim], lk[(1 * 29 + first - 1) * kHeadDim]) << "the row before: kept";
  EXPECT_THROW(by_block.write_block_raw(2, 20, 10, bk.data(), bv.data()), std::out_of_range);
  EXPECT_THROW(by_block.write_block_raw(3, 0, 1, bk.data(), bv.data()), std::out_of_range);
}

TEST(KvPagePool, ReservationsAreAllOrNothingAndCountedApartFromCaches) {
  auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 8, 4);
  EXPECT_TRUE(pool->try_reserve(5));
  EXPECT_FALSE(pool->try_reserve(4));
  EXPECT_EQ(pool->reserved_pages(), 5);
  EXPECT_TRUE(pool->try_reserve(3));
  EXPECT_FALSE(pool->try_reserve(1));
  // Caches draw on free pages; a reservation is the admission's promise.
  KvCache c = pool->make_cache(16 * 5);
  EXPECT_EQ(pool->free_pages(), 3);
  EXPECT_EQ(pool->reserved_pages(), 8);
  pool->unreserve(5);
  pool->unreserve(3);
  EXPECT_EQ(pool->reserved_pages(), 0);
  pool->unreserve(1);  // more than reserved: reported, clamped at zero
  EXPECT_EQ(pool->reserved_pages(), 0);
  EXPECT_THROW(pool->try_reserve(-1), std::invalid_argument);
}

// The reservations have one writer once claimed (the server's intake): a write from
// any other thread is counted (and still done); unclaimed, nothing is checked.
TEST(KvPagePool, ReservationsWrittenByAThreadThatDoesNotOwnThemAreCounted) {
  auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 8, 4);
  std::thread([&] { EXPECT_TRUE(pool->try_reserve(1)); }).join();
  EXPECT_EQ(pool->foreign_reservation_writes(), 0);  // unclaimed
  pool->claim_reservations();
  EXPECT_TRUE(pool->try_reserve(2));
  pool->unreserve(1);
  EXPECT_EQ(pool->foreign_reservation_writes(), 0);
  std::thread([&] {
    EXPECT_TRUE(pool->try_reserve(1));
    pool->unreserve(1);
    pool->set_reserved(2);
  }).join();
  EXPECT_EQ(pool->foreign_reservation_writes(), 3);
  EXPECT_EQ(pool->reserved_pages(), 2);
  // The owner rebuilds the whole ledger (clamped to the pool); a new owner claims it.
  pool->set_reserved(100);
  EXPECT_EQ(pool->reserved_pages(), 8);
  std::thread([&] {
    pool->claim_reservations();
    pool->set_reserved(0);
  }).join();
  EXPECT_EQ(pool->foreign_reservation_writes(), 3);
  pool->unreserve(0);  // the old owner's thread is a foreign one now
  EXPECT_EQ(pool->foreign_reservation_writes(), 4);
}

TEST(KvPagePool, ManyThreadsMakingAndDroppingCachesLeakNothing) {
  auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 64, 4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([pool, t] {
      for (int i = 0; i < 500; ++i) {
        auto c = pool->try_make_cache(1 + (i * 7 + t * 13) % 100);
        if (c) {
          const auto rows = iota_rows(1, static_cast<float>(i));
          c->write_rows(0, 0, 0, 1, rows.data(), rows.data());
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(pool->free_pages(), 64);
}

// A half-precision pool: pages of half the bytes; rows written as fp32 are rounded
// to the dtype (what attention reads through the view too), raw rows move unchanged,
// and in-place fp32 row access is refused.
TEST(KvPagePool, HalfPrecisionPagesRoundRowsAndCopyRawOnesUnchanged) {
  for (const kernels::TensorType dtype : {kernels::TensorType::F16, kernels::TensorType::BF16}) {
    SCOPED_TRACE(kernels::kv_dtype_name(dtype));
    auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 8, 3, dtype);
    EXPECT_EQ(pool->dtype(), dtype);
    EXPECT_EQ(pool->page_bytes(), 2 * kLayers * kHeads * 8 * kHeadDim * 2);
    EXPECT_EQ(KvPagePool::pages_in(pool->page_bytes() * 5, kLayers, kHeads, kHeadDim, 3, dtype), 5);
    EXPECT_EQ(KvPagePool::pages_in(pool->page_bytes() * 5, kLayers, kHeads, kHeadDim, 3), 2) << "f32 pages: twice the bytes";
    KvCache filler = pool->make_cache(8);
    KvCache cache = pool->make_cache(20);  // 3 pages, not the first
    std::vector<float> k(20 * kHeadDim), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = 1.0f + static_cast<float>(i) * 0.001f;  // not representable in 16 bits
      v[i] = -static_cast<float>(i) / 3.0f;
    }
    cache.write_rows(2, 1, 0, 20, k.data(), v.data());
    std::vector<float> rk(k.size()), rv(k.size());
    cache.read_rows(2, 1, 0, 20, rk.data(), rv.data());
    int64_t rounded = 0;
    for (size_t i = 0; i < k.size(); ++i) {
      const uint16_t hk = dtype == kernels::TensorType::F16 ? kernels::fp32_to_fp16(k[i]) : kernels::fp32_to_bf16(k[i]);
      const float wk = dtype == kernels::TensorType::F16 ? kernels::fp16_to_fp32(hk) : kernels::bf16_to_fp32(hk);
      ASSERT_EQ(rk[i], wk) << i;
      rounded += rk[i] != k[i];
      ASSERT_LE(std::fabs(rv[i] - v[i]), std::fabs(v[i]) * (dtype == kernels::TensorType::F16 ? 1e-3 : 8e-3));
    }
    EXPECT_GT(rounded, 0) << "the values were stored in 16 bits";
    // The kernels' view reads the same values.
    const kernels::KvView view = cache.view(2);
    EXPECT_EQ(view.dtype, dtype);
    std::vector<float> row(kHeadDim);
    for (int64_t p : {0, 7, 8, 19}) {
      view.read_k_row(1, p, row.data());
      EXPECT_TRUE(std::equal(row.begin(), row.end(), rk.begin() + p * kHeadDim)) << p;
    }
    // K only (v = nullptr) leaves V alone.
    std::vector<float> zeros(k.size(), 0.0f);
    cache.write_rows(2, 1, 0, 20, zeros.data(), nullptr);
    std::vector<float> rk2(k.size()), rv2(k.size());
    cache.read_rows(2, 1, 0, 20, rk2.data(), rv2.data());
    EXPECT_EQ(rk2, zeros);
    EXPECT_EQ(rv2, rv);
    // Raw rows: 2 bytes each, copied unchanged across page boundaries.
    std::vector<std::byte> raw_k(static_cast<size_t>(13 * kHeadDim * 2)), raw_v(raw_k.size());
    cache.read_rows_raw(2, 1, 5, 13, raw_k.data(), raw_v.data());
    KvCache other = pool->make_cache(20);
    other.write_rows_raw(0, 0, 2, 13, raw_k.data(), raw_v.data());
    std::vector<float> ok(13 * kHeadDim), ov(ok.size());
    other.read_rows(0, 0, 2, 13, ok.data(), ov.data());
    EXPECT_TRUE(std::equal(ov.begin(), ov.end(), rv.begin() + 5 * kHeadDim));
    EXPECT_THROW(cache.k_at(0, 0, 0), std::logic_error);
  }
  EXPECT_THROW(KvPagePool::make(kLayers, kHeads, kHeadDim, 2, 3, kernels::TensorType::Q8_0), std::invalid_argument);
}

TEST(KvPagePool, BadShapesAreRefused) {
  EXPECT_THROW(KvPagePool::make(0, kHeads, kHeadDim, 4), std::invalid_argument);
  EXPECT_THROW(KvPagePool::make(kLayers, kHeads, kHeadDim, 0), std::invalid_argument);
  EXPECT_THROW(KvPagePool::make(kLayers, kHeads, kHeadDim, 4, 21), std::invalid_argument);
  auto pool = KvPagePool::make(kLayers, kHeads, kHeadDim, 4);
  EXPECT_THROW(pool->make_cache(0), std::invalid_argument);
  EXPECT_EQ(KvPagePool::pages_in(1, kLayers, kHeads, kHeadDim), 1);
  EXPECT_EQ(KvPagePool::pages_in(pool->page_bytes() * 5 + 7, kLayers, kHeads, kHeadDim), 5);
}

}  // namespace
}  // namespace bs
