// The CUDA backend's decode steps (cuda_backend_impl.h): a step's ops captured once
// per shape as a CUDA graph and replayed, its paged-KV rows uploaded before each replay.
#include "kernels/cuda/cuda_backend_impl.h"

namespace bs::kernels::cuda_backend_detail {

void CudaBackend::decode_step(const KvView* views, int layers, int64_t n, const std::function<void()>& body) {
  if (n <= 0 || layers <= 0) {
    body();
    return;
  }
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> step_lock(step_mu_);
  int64_t max_keys = 0;
  for (int64_t i = 0; i < n * layers; ++i) max_keys = std::max(max_keys, views[i].capacity);
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    upload_step(views, layers, n);
  }
  struct Unregister {
    CudaBackend& be;
    ~Unregister() { be.step_views_ = nullptr; }
  } unregister{*this};
  if (!graphs_enabled_) {
    body();
    return;
  }
  const StepKey key{n, keys_bucket(max_keys)};
  StepGraph& g = step_graphs_[key];
  if (g.never) {
    body();
    return;
  }
  if (g.exec) {
    // Checked under ops_mu_, which every scratch growth holds: nothing the graph points
    // into can be freed between the check and the launch (a free later waits for it).
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (g.generation == generation_) {
      BS_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_.get()));
      ++graph_launches_;
      return;
    }
  }
  if (g.exec) drop_graphs();  // stale: something they point into was reallocated
  StepGraph& h = step_graphs_[key];
  if (h.eager_generation != generation_) {  // first sight of this key since a growth: eager
    body();
    h.eager_generation = generation_;
    return;
  }
  const uint64_t before = generation_;
  cudaGraph_t graph = nullptr;
  BS_CUDA_CHECK(cudaStreamBeginCapture(capture_stream_.get(), cudaStreamCaptureModeThreadLocal));
  capturing_ = std::this_thread::get_id();
  try {
    body();
  } catch (...) {
    capturing_ = std::thread::id();
    (void)cudaStreamEndCapture(capture_stream_.get(), &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    h.never = true;  // not capturable: this key runs eagerly from now on
    body();
    return;
  }
  capturing_ = std::thread::id();
  BS_CUDA_CHECK(cudaStreamEndCapture(capture_stream_.get(), &graph));
  if (generation_ != before) {  // something grew while capturing: the graph may point at freed memory
    cudaGraphDestroy(graph);
    h.eager_generation = generation_;
    body();
    return;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  BS_CUDA_CHECK(e);
  h.exec = exec;
  h.generation = before;
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (generation_ == before) {
      BS_CUDA_CHECK(cudaGraphLaunch(h.exec, stream_.get()));
      ++graph_launches_;
      return;
    }
  }
  body();  // something was reallocated since the capture: this step eagerly, the graph stale
}

int64_t CudaBackend::keys_bucket(int64_t keys) {
  int64_t b = 64;
  while (b < keys) b *= 2;
  return b;
}

void CudaBackend::upload_step(const KvView* views, int layers, int64_t n) {
  const int64_t count = n * layers;
  std::vector<const int32_t*> tables;  // distinct host page tables, in first-use order
  std::vector<int64_t> table_at;       // their offsets (int32 elements) after the views
  std::vector<int64_t> view_table(static_cast<size_t>(count));
  int64_t pages = 0;
  for (int64_t i = 0; i < count; ++i) {
    const auto it = std::find(tables.begin(), tables.end(), views[i].pages);
    if (it != tables.end()) {  // a row's table again (its other layers)
      view_table[static_cast<size_t>(i)] = table_at[static_cast<size_t>(it - tables.begin())];
      continue;
    }
    tables.push_back(views[i].pages);
    table_at.push_back(pages);
    view_table[static_cast<size_t>(i)] = pages;
    pages += views[i].page_count;
  }
  const size_t views_bytes = static_cast<size_t>(count) * sizeof(cuda::DevicePagedKv);
  auto* base = static_cast<std::byte*>(grow(step_rows_, views_bytes + static_cast<size_t>(pages) * sizeof(int32_t)));
  auto* dev_pages = reinterpret_cast<int32_t*>(base + views_bytes);
  std::vector<std::byte>& host = step_host_;
  host.resize(views_bytes + static_cast<size_t>(pages) * sizeof(int32_t));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t at = view_table[static_cast<size_t>(i)];
    const cuda::DevicePagedKv view = cuda::device_view(views[i], dev_pages + at);
    std::memcpy(host.data() + static_cast<size_t>(i) * sizeof(cuda::DevicePagedKv), &view, sizeof(view));
    std::memcpy(host.data() + views_bytes + static_cast<size_t>(at) * sizeof(int32_t), views[i].pages,
                static_cast<size_t>(views[i].page_count) * sizeof(int32_t));
  }
  {
    std::lock_guard<std::mutex> lock(upload_mu_);
    upload_ring_->copy_in(base, host.data(), static_cast<int64_t>(host.size()), stream_.get());
  }
  step_views_ = views;
  step_layers_ = layers;
  step_n_ = n;
}

const cuda::DevicePagedKv* CudaBackend::step_rows(const KvView* kv, int64_t n) const {
  if (!step_views_ || n != step_n_ || kv < step_views_ || kv >= step_views_ + step_n_ * step_layers_) return nullptr;
  const int64_t offset = kv - step_views_;
  if (offset % step_n_ != 0) return nullptr;
  return step_rows_.as<cuda::DevicePagedKv>() + offset;
}

void CudaBackend::drop_graphs() {
  waits_->for_stream(stream_.get(), "the launches of decode-step graphs before they are dropped");
  for (auto& [key, g] : step_graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  step_graphs_.clear();
}

}  // namespace bs::kernels::cuda_backend_detail
