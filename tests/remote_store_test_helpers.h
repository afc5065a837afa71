// What the remote tier's suites share (test_remote_*.cpp): the cluster secret, a
// storage node on loopback over a DiskKvStore in a temp dir (Node), and byte-wise
// comparison of chunks and of every layer read.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it.
#include <utility>
// clang-format off
#include <boost/asio.hpp>
// clang-format on

#include "kernels/kv_view.h"
#include "storage/disk_store.h"
#include "storage/hmac_auth.h"
#include "storage/remote_protocol.h"
#include "storage/remote_store.h"
#include "storage/storage_server.h"
#include "faulty_file_io.h"
#include "temp_dir.h"
#include "tests/random_kv.h"

namespace bs::remote_store_test {

using testing::key_of;
using testing::random_kv;

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;
using remote::MsgType;

inline constexpr char kSecret[] = "the cluster secret";

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Random bit patterns: equality below is bytewise.

inline bool same(const ChunkKv& a, const ChunkKv& b) {
  return a.tokens == b.tokens && a.n_layers == b.n_layers && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim &&
         a.dtype == b.dtype && a.k == b.k && a.v == b.v;
}

// A storage node: an SSD tier in a temp dir served on a loopback port.
struct Node {
  explicit Node(StorageServerOptions o = {}, int port = 0, std::shared_ptr<FileIo> io = nullptr) {
    disk = std::make_unique<DiskKvStore>(dir.path().string(), int64_t{1} << 30, false, DiskKvStore::EntryVisitor{},
                                         std::move(io));
    o.secret = o.secret.empty() ? kSecret : o.secret;
    o.port = port;
    if (o.io_timeout_s == StorageServerOptions{}.io_timeout_s) o.io_timeout_s = 2;
    opt = o;
    server = std::make_unique<StorageServer>(*disk, o);
  }
  RemoteStoreOptions client(std::string secret = kSecret) const {
    RemoteStoreOptions c;
    c.port = server->port();
    c.secret = std::move(secret);
    c.connect_timeout_s = 1;
    c.io_timeout_s = 0.5;
    c.retry_after_s = 0.3;
    return c;
  }
  testing::TempDir dir{"bs_remote"};
  std::unique_ptr<DiskKvStore> disk;
  StorageServerOptions opt;
  std::unique_ptr<StorageServer> server;
};

// Every layer through `reader` in `order`, checked against the SSD tier's own read.
inline void expect_layers_equal(LayerReader& reader, DiskKvStore& disk, const ChunkKey& key, const std::vector<int>& order) {
  auto e = disk.open(key);
  ASSERT_TRUE(e);
  const size_t lb = static_cast<size_t>(e->layer_bytes());
  ASSERT_EQ(static_cast<int64_t>(lb), reader.layer_bytes());
  std::vector<std::byte> k(lb), v(lb), dk(lb), dv(lb);
  for (int l : order) {
    ASSERT_TRUE(reader.read_layer(l, k.data(), v.data())) << "layer " << l;
    ASSERT_TRUE(disk.read_layer(*e, l, dk.data(), dv.data()));
    ASSERT_EQ(k, dk) << "layer " << l;
    ASSERT_EQ(v, dv) << "layer " << l;
  }
}

inline std::vector<int> in_order(int n) {
  std::vector<int> o(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) o[static_cast<size_t>(i)] = i;
  return o;
}


}  // namespace bs::remote_store_test
