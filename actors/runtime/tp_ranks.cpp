#include "actors/runtime/tp_ranks.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace bs {
RankFollower::RankFollower(int rank, Parts parts, TpRanks& group, const TraceBook& traces)
    : rank_(rank), parts_(std::move(parts)), group_(group), traces_(traces) {}

RankFollower::~RankFollower() {
  if (parts_.compute) parts_.compute->stop(false);
}

void RankFollower::execute(const RankJob& job, const RankTargetPtr& target) {
  try {
    if (fault) fault(rank_, job);
    switch (job.kind) {
      case RankJob::Prefill: prefill(job, target); break;
      case RankJob::Decode: decode(job.ids, job.tokens); break;
      case RankJob::Chunk: chunk(job); break;
      case RankJob::End:
        requests_.erase(job.id);
        break;
      default: throw std::invalid_argument("unknown rank job " + std::to_string(job.kind));
    }
  } catch (const kernels::CommError&) {
    // The group failed (another rank, a timeout): rank 0 reports it.
  } catch (const std::exception& e) {
    group_.count_failure();
    std::fprintf(stderr, "blendserve: tensor-parallel rank %d failed: %s\n", rank_, e.what());
    group_.comm(rank_).abort(std::string("rank ") + std::to_string(rank_) + " failed: " + e.what());
  }
  requests_held_.store(static_cast<int64_t>(requests_.size()));
  group_.job_done(rank_);
}

void RankFollower::missing(const std::string& what) const {
  // A job sent before the group failed reaches this rank after rank 0 dropped the
  // request with the failure (its load target, its decode state): the failure was
  // counted where it happened, and this stale job is not another one. The group's
  // communicators are replaced only once every job sent before is done, so the failed
  // one is still this rank's here.
  if (group_.comm(rank_).failed())
    throw kernels::CommError("rank " + std::to_string(rank_) + ": " + what + " (the group failed before)");
  throw std::runtime_error(what);
}

void RankFollower::prefill(const RankJob& job, const RankTargetPtr& target) {
  Request& q = requests_[job.id];
  if (job.restart || !q.begun) {
    q.target = target;
    if (!q.target) {
      requests_.erase(job.id);
      missing("request " + std::to_string(job.id) + " has no KV cache on rank " + std::to_string(rank_));
    }
    q.run = parts_.engine->begin(job.plan.prompt, job.plan.loaded, q.target->cache, job.plan.options, 1);
    q.begun = true;
  }
  const TracePtr trace = traces_.find(job.id);
  const std::string actor = "rank-" + std::to_string(rank_);
  while (true) {
    RankDecision d = group_.await(rank_);
    switch (d.kind) {
      case RankDecision::Step: {
        const int layer = q.run.next_layer();
        // The rank worker's copies of this layer come first (on the device; a no-op on
        // a host backend).
        for (const auto& copied : q.target->copied.take(layer)) parts_.backend->wait(*copied);
        const double begin = trace->now_s();
        const double waited = parts_.tf->collective_stats().seconds;
        parts_.engine->step(q.run);
        const double end = trace->now_s(), wait = parts_.tf->collective_stats().seconds - waited;
        q.collective_s += wait;
        trace->add_event({actor, "compute", layer, begin, end, 0});
        trace->add_event({actor, "collective wait", layer, end - wait, end, 0});
        break;
      }
      case RankDecision::Decode: decode(d.ids, d.tokens); break;
      case RankDecision::Continue: break;
      case RankDecision::Stop: return;  // parked, or failed: rank 0 says what comes next
      case RankDecision::Finish: {
        BlendPrefill done = parts_.engine->finish(std::move(q.run));
        q.cache = std::move(done.cache);
        q.decoding = true;
        q.target.reset();
        trace->set(actor + "_collective_s", q.collective_s);
        return;
      }
      default: throw std::runtime_error("unknown decision " + std::to_string(d.kind) + " in a prefill");
    }
  }
}

void RankFollower::decode(const std::vector<uint64_t>& ids, const std::vector<int32_t>& tokens) {
  if (ids.size() != tokens.size()) throw std::invalid_argument("decode: ids and tokens differ in count");
  std::vector<KvCache*> caches;
  for (uint64_t id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end() || !it->second.decoding)
      missing("request " + std::to_string(id) + " has no decode cache on rank " + std::to_string(rank_));
    caches.push_back(&it->second.cache);
  }
  // The logits are rank 0's to sample from; here only the caches grow (and the
  // collectives match rank 0's).
  parts_.tf->decode_step(tokens, caches);
}

void RankFollower::chunk(const RankJob& job) {
  const LayerWait between = [&](int) {
    RankDecision d = group_.await(rank_);
    if (d.kind == RankDecision::Decode) decode(d.ids, d.tokens);
    else if (d.kind != RankDecision::Continue)
      throw std::runtime_error("unknown decision " + std::to_string(d.kind) + " between a chunk's layers");
  };
  // Every rank returns the whole chunk (gathered); rank 0 stores it.
  if (job.prefix) parts_.engine->compute_prefix_kv(job.tokens, between);
  else parts_.engine->compute_chunk_kv(job.tokens, between);
}

TpRanks::TpRanks(Comms comms, MakeComms make, Transformer& leader, std::chrono::milliseconds timeout)
    : size_(static_cast<int>(comms.size())),
      timeout_(timeout),
      leader_(leader),
      comms_(std::move(comms)),
      make_comms_(std::move(make)),
      sent_(static_cast<size_t>(size_), 0),
      done_(static_cast<size_t>(size_), 0) {
  if (size_ < 2) throw std::invalid_argument("TpRanks: a group of " + std::to_string(size_) + " ranks");
}

TpRanks::~TpRanks() {
  // Followers' compute threads stop before the communicators they use go.
  for (auto& f : followers_) f.reset();
}

kernels::Communicator& TpRanks::comm(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return *comms_.at(static_cast<size_t>(rank));
}

void TpRanks::add_follower(std::unique_ptr<RankFollower> f) {
  if (f->rank() != static_cast<int>(followers_.size()) + 1 || f->rank() >= size_)
    throw std::logic_error("TpRanks: follower rank " + std::to_string(f->rank()) + " out of order");
  followers_.push_back(std::move(f));
}

RankFollower& TpRanks::follower(int rank) const { return *followers_.at(static_cast<size_t>(rank - 1)); }

void TpRanks::set_send(Send send) { send_ = std::move(send); }

void TpRanks::dispatch(const RankJob& job) {
  if (job.kind != RankJob::End) {
    bool failed = false;
    for (const auto& c : comms_) failed = failed || c->failed();  // comms_ changes only here, on this thread
    if (failed) rebuild();
  }
  for (int r = 1; r < size_; ++r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++sent_[static_cast<size_t>(r)];
    }
    send_(r, job);
  }
}

void TpRanks::announce(const RankDecision& d) {
  kernels::Communicator& c = comm(0);
  int64_t head[2] = {d.kind, static_cast<int64_t>(d.ids.size())};
  c.broadcast(head, sizeof head, 0, timeout_);
  if (head[1] == 0) return;
  std::vector<std::byte> body(d.ids.size() * (sizeof(uint64_t) + sizeof(int32_t)));
  std::memcpy(body.data(), d.ids.data(), d.ids.size() * sizeof(uint64_t));
  std::memcpy(body.data() + d.ids.size() * sizeof(uint64_t), d.tokens.data(), d.tokens.size() * sizeof(int32_t));
  c.broadcast(body.data(), static_cast<int64_t>(body.size()), 0, timeout_);
}

RankDecision TpRanks::await(int rank) {
  kernels::Communicator& c = comm(rank);
  int64_t head[2] = {0, 0};
  c.broadcast(head, sizeof head, 0, timeout_);
  RankDecision d;
  d.kind = static_cast<int32_t>(head[0]);
  if (head[1] < 0 || head[1] > (int64_t{1} << 24)) throw std::runtime_error("a decision for an impossible batch");
  if (head[1] == 0) return d;
  const size_t n = static_cast<size_t>(head[1]);
  std::vector<std::byte> body(n * (sizeof(uint64_t) + sizeof(int32_t)));
  c.broadcast(body.data(), static_cast<int64_t>(body.size()), 0, timeout_);
  d.ids.resize(n);
  d.tokens.resize(n);
  std::memcpy(d.ids.data(), body.data(), n * sizeof(uint64_t));
  std::memcpy(d.tokens.data(), body.data() + n * sizeof(uint64_t), n * sizeof(int32_t));
  return d;
}

void TpRanks::fail(const std::string& why) {
  kernels::Communicator& c = comm(0);
  if (c.failed()) return;  // a failure elsewhere (counted where it happened) stopped this job
  failures_.fetch_add(1);
  c.abort("rank 0 failed: " + why);
}

void TpRanks::job_done(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_[static_cast<size_t>(rank)];
  }
  done_cv_.notify_all();
}

void TpRanks::forget_jobs(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_[static_cast<size_t>(rank)] = sent_[static_cast<size_t>(rank)];
  }
  done_cv_.notify_all();
}

void TpRanks::rebuild() {
  // Every follower first finishes what it was sent (each such job fails fast on the
  // failed communicator): then none uses a communicator while they are replaced.
  std::unique_lock<std::mutex> lock(mu_);
  const auto bound = 2 * timeout_ + std::chrono::seconds(1);
  const bool idle = done_cv_.wait_for(lock, bound, [&] {
    for (int r = 1; r < size_; ++r)
      if (done_[static_cast<size_t>(r)] < sent_[static_cast<size_t>(r)]) return false;
    return true;
  });
  if (!idle)
    throw kernels::CommError("tensor parallel: a rank did not finish its jobs within " +
                             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(bound).count()) +
                             " s; the communicators are not rebuilt yet");
  Comms fresh = make_comms_();  // throws (CommError, a CUDA error) when it cannot form: the next job tries again
  if (static_cast<int>(fresh.size()) != size_)
    throw kernels::CommError("tensor parallel: a rebuilt group of " + std::to_string(fresh.size()) + " ranks for " +
                             std::to_string(size_));
  comms_ = std::move(fresh);
  leader_.set_communicator(comms_[0].get());
  for (auto& f : followers_) f->transformer().set_communicator(comms_[static_cast<size_t>(f->rank())].get());
  rebuilds_.fetch_add(1);
}

}  // namespace bs
