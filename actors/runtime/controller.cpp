// loading controller (CacheBlend §5): where each chunk's KV comes from, and at
// which ratio to recompute. Loading and recompute overlap layer by layer, so TTFT
// is about max(load time, recompute time). When loading is the slower of the two,
// recomputing more tokens is free and buys quality: the ratio is raised until the
// estimated recompute time meets the estimated load time, never below the
// configured floor. Estimates come from measured profiles (bytes/s per tier from
// the loaders, seconds per row-layer from the worker), refined after every request,
// each sample weighted by its size (MeasuredCost);
// the rows per layer follow the filtering in use (planned_rows_per_layer). The
// query-first selection is the exception: its question pass reads every layer before
// the recompute starts, so the recompute follows the load instead of hiding behind
// it. A query-first request keeps its floor, unless the deviation's overlapped pass,
// at the ratio the load pays for, is predicted to answer sooner: then it goes that
// way. The decision, with the predicted TTFT, is in the request's trace.
#include <algorithm>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"
#include "kernels/kv_view.h"

namespace bs {
namespace {

// A sample of `units` in `seconds` into a cost (MeasuredCost: weighted by its size);
// the estimate becomes seconds per unit, or units per second with `rate`.
void update(MeasuredCost& m, double& value, int64_t units, double seconds, bool rate) {
  m.add(static_cast<double>(units), seconds);
  value = rate ? m.units / m.seconds : m.seconds / m.units;
}

// The tiers' profiles start from each tier's start value.
void init_tiers(ControllerState& st, const ControllerEnv& env) {
  if (st.tier_bytes_per_s.size() == env.tiers.size()) return;
  st.tier_bytes_per_s.clear();
  for (const auto& t : env.tiers) st.tier_bytes_per_s.push_back(t.start_bytes_per_s);
  st.tier_measured.assign(env.tiers.size(), MeasuredCost{});
}

}  // namespace

controller_actor::behavior_type controller(controller_actor::stateful_pointer<ControllerState> self,
                                           ControllerEnv env, HandlesRef h, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  init_tiers(self->state, env);
  return {
      [=](plan_atom, RequestPlan& r) {
        BusyScope busy(*c, self->mailbox().size());
        const auto trace = env.traces.find(r.id);
        const double t_begin = trace->now_s();
        auto& st = self->state;
        const auto& cfg = env.model->full_config();
        const auto& tiers = env.tiers;
        const bool use_chunks = r.options.mode == BlendMode::Reuse || r.options.mode == BlendMode::Blend;
        const bool use_prefix = r.options.mode != BlendMode::Full;
        const size_t nchunks = r.prompt.chunks.size();
        r.chunk_tier.assign(nchunks, kMissTier);
        r.prefix_block_tier.clear();
        r.loaded.chunk_loaded.assign(nchunks, 0);
        r.loaded.prefix_cached = 0;
        int64_t cached_tokens = 0;
        std::vector<int64_t> bytes_by_tier(tiers.size(), 0);
        // Bytes a stored token's K and V take in its entry's dtype (f16 by default: the
        // estimate once counted 4 bytes an element, twice the load). Loaders read every
        // KV head of an entry whatever the tensor-parallel degree, so these are the bytes
        // moved from the tier.
        const int64_t token_elements = 2 * static_cast<int64_t>(cfg.n_layers) * cfg.kv_dim();
        // The first tier (in lookup order) that holds a usable entry. The entry is
        // opened to check it and closed again: the tier's loader opens it to read.
        auto locate = [&](const ChunkKey& key, std::span<const int32_t> tokens) -> TierId {
          if (tokens.empty()) return kMissTier;
          for (size_t t = 0; t < tiers.size(); ++t) {
            auto reader = tiers[t].store->open_layers(key);
            // A hash collision or a stale entry must never be used as this chunk's KV.
            if (reader && std::ranges::equal(reader->tokens(), tokens) && reader->n_layers() == cfg.n_layers &&
                reader->kv_heads() == cfg.n_kv_heads && reader->head_dim() == cfg.head_dim) {
              bytes_by_tier[t] +=
                  static_cast<int64_t>(tokens.size()) * token_elements * kernels::kv_dtype_bytes(reader->dtype());
              return static_cast<TierId>(t);
            }
          }
          return kMissTier;
        };
        // Automatic prefix caching: the run of stored blocks from block 0 (a block is
        // valid only behind the very blocks before it: its key chains them).
        if (use_prefix && r.prefix_block > 0) {
          const auto all = r.prompt.concatenated();
          for (size_t j = 0; j < r.prefix_block_keys.size(); ++j) {
            const auto block = std::span<const int32_t>(all).subspan(j * static_cast<size_t>(r.prefix_block),
                                                                     static_cast<size_t>(r.block_length(j)));
            const TierId t = locate(r.prefix_block_keys[j], block);
            if (t == kMissTier) break;
            r.prefix_block_tier.push_back(t);
          }
          const int64_t hit = r.blocks_tokens(r.prefix_block_tier.size());
          // Without chunks the blocks may reach past the template's prefix (an earlier
          // turn's question, the same request again): the cut moves to cover them; the
          // prompt's tokens are unchanged.
          const int64_t P = static_cast<int64_t>(r.prompt.prefix.size());
          if (hit > P && nchunks == 0) {
            r.prompt.prefix.insert(r.prompt.prefix.end(), r.prompt.suffix.begin(), r.prompt.suffix.begin() + (hit - P));
            r.prompt.suffix.erase(r.prompt.suffix.begin(), r.prompt.suffix.begin() + (hit - P));
          }
          r.loaded.prefix_cached = hit;
        }
        if (use_chunks)
          for (size_t i = 0; i < nchunks; ++i) {
            r.chunk_tier[i] = locate(r.chunk_keys[i], r.prompt.chunks[i]);
            if (r.chunk_tier[i] != kMissTier) {
              r.loaded.chunk_loaded[i] = 1;
              cached_tokens += static_cast<int64_t>(r.prompt.chunks[i].size());
            }
          }

        // Compute at ratio x: the rows the filtering in use runs through each layer
        // (gradual filtering computes every cached row up to the first check layer
        // and narrows after each), at the measured seconds per row-layer, plus the
        // per-prompt-token overhead (embedding, selection outside the layers, logits).
        const int64_t other_tokens = r.prompt.size() - cached_tokens - r.loaded.prefix_cached;
        double est_load = 0;  // the tiers' loaders run in parallel
        for (size_t t = 0; t < tiers.size(); ++t)
          est_load = std::max(est_load, static_cast<double>(bytes_by_tier[t]) / st.tier_bytes_per_s[t]);
        const double overhead = st.overhead_s_per_prompt_token * static_cast<double>(r.prompt.size());
        const float floor = r.options.ratio;
        auto rows_at = [&](Selection rule, double ratio) {
          BlendOptions o = r.options;
          o.selection = rule;
          o.ratio = static_cast<float>(ratio);
          return planned_rows_per_layer(o, cfg.n_layers, other_tokens, cached_tokens);
        };
        auto est_compute = [&](Selection rule, double ratio) {
          double rows = 0;
          for (double x : rows_at(rule, ratio)) rows += x;
          return overhead + st.compute_s_per_token_layer * rows;
        };
        // TTFT: layer l computes once it is loaded (the loads spread evenly over the
        // layers) and the layer before it is done. query-first: the question's pass
        // (a few rows, counted in the overhead) keeps pace with the load, the
        // recompute runs after it.
        auto est_ttft = [&](Selection rule, double ratio) {
          if (rule == Selection::QueryFirst) return est_compute(rule, ratio) + est_load;
          const auto rows = rows_at(rule, ratio);
          double t = 0;
          for (int l = 0; l < cfg.n_layers; ++l)
            t = std::max(t, est_load * (l + 1) / cfg.n_layers) + st.compute_s_per_token_layer * rows[static_cast<size_t>(l)];
          return overhead + t;
        };
        // The largest ratio whose compute under `rule` still fits the load (compute
        // grows with the ratio), no higher than an explicit schedule's kept fractions
        // allow; the floor when even the floor does not fit.
        const double budget = ControllerState::load_margin * est_load;
        auto raised = [&](Selection rule) {
          if (budget <= est_compute(rule, floor)) return static_cast<double>(floor);
          double ceiling = 1.0;
          for (float f : r.options.schedule) ceiling = std::min(ceiling, static_cast<double>(f));
          double lo = floor, hi = std::max(ceiling, static_cast<double>(floor));
          if (est_compute(rule, hi) <= budget) return hi;
          for (int i = 0; i < 40; ++i) {
            const double mid = 0.5 * (lo + hi);
            (est_compute(rule, mid) <= budget ? lo : hi) = mid;
          }
          return lo;
        };
        const Selection asked = r.options.selection;
        const double est_compute_floor = est_compute(asked, floor);
        std::string reason = "floor";
        const bool adapt = r.options.mode == BlendMode::Blend && env.config.adaptive_ratio && !r.ratio_requested &&
                           cached_tokens > 0;
        if (adapt && asked == Selection::QueryFirst) {
          // query-first cannot hide its recompute behind the load. When the load is
          // slow enough that the deviation's overlapped pass, at the ratio the load
          // pays for, answers sooner, the request goes that way instead.
          const double by_deviation = raised(Selection::Deviation);
          if (est_ttft(Selection::Deviation, by_deviation) < est_ttft(Selection::QueryFirst, floor)) {
            r.options.selection = Selection::Deviation;
            r.options.ratio = static_cast<float>(by_deviation);
            reason = "load-bound: deviation, recompute while loading (query-first would wait for the load)";
          } else {
            reason = "floor: query-first recomputes after the load";
          }
        } else if (adapt && budget > est_compute_floor) {
          r.options.ratio = static_cast<float>(raised(asked));
          reason = "load-bound: recompute while loading";
        } else if (r.ratio_requested) {
          reason = "requested";
        } else if (asked == Selection::QueryFirst) {
          reason = "floor: query-first recomputes after the load";
        }
        nlohmann::json inputs = {{"compute_s_per_token_layer", st.compute_s_per_token_layer},
                                 {"overhead_s_per_prompt_token", st.overhead_s_per_prompt_token},
                                 {"cached_tokens", cached_tokens},
                                 {"prefix_cached_tokens", r.loaded.prefix_cached},
                                 {"other_tokens", other_tokens}};
        for (size_t t = 0; t < tiers.size(); ++t) {
          inputs["bytes_" + tiers[t].name] = bytes_by_tier[t];
          inputs[tiers[t].name + "_bytes_per_s"] = st.tier_bytes_per_s[t];
        }
        nlohmann::json decision = {{"ratio", r.options.ratio},
                                   {"ratio_floor", floor},
                                   {"reason", reason},
                                   {"inputs", std::move(inputs)},
                                   {"est_load_s", est_load},
                                   {"est_compute_at_floor_s", est_compute_floor},
                                   {"est_compute_s", est_compute(r.options.selection, r.options.ratio)},
                                   {"est_ttft_s", est_ttft(r.options.selection, r.options.ratio)},
                                   {"selection", selection_name(r.options.selection)}};
        r.decision = decision.dump();
        auto tier_names = nlohmann::json::array();
        for (TierId t : r.chunk_tier) tier_names.push_back(t == kMissTier ? "miss" : tiers[static_cast<size_t>(t)].name);
        trace->set("controller", std::move(decision));
        trace->set("chunk_tiers", std::move(tier_names));
        trace->set("ratio", r.options.ratio);
        trace->add_event({"controller", "plan", -1, t_begin, trace->now_s(), 0});
        // The worker allocates the cache and starts the loaders.
        self->send(h->worker(), prefill_atom::value, std::move(r));
      },
      [=](profile_atom, const std::string& source, int64_t units, double seconds) {
        BusyScope busy(*c, self->mailbox().size());
        if (units <= 0 || !(seconds > 0)) return;
        auto& st = self->state;
        for (size_t t = 0; t < env.tiers.size(); ++t)
          if (source == env.tiers[t].name) {
            update(st.tier_measured[t], st.tier_bytes_per_s[t], units, seconds, /*rate=*/true);
            return;
          }
        if (source == "compute")
          update(st.compute_measured, st.compute_s_per_token_layer, units, seconds, false);
        else if (source == "overhead")
          update(st.overhead_measured, st.overhead_s_per_prompt_token, units, seconds, false);
      },
      [=](get_profile_atom) -> std::string {
        BusyScope busy(*c, self->mailbox().size());
        const auto& st = self->state;
        nlohmann::json j = {{"compute_s_per_token_layer", st.compute_s_per_token_layer},
                            {"overhead_s_per_prompt_token", st.overhead_s_per_prompt_token},
                            {"compute_samples", st.compute_measured.samples}};
        for (size_t t = 0; t < env.tiers.size(); ++t) {
          j[env.tiers[t].name + "_bytes_per_s"] = st.tier_bytes_per_s[t];
          j[env.tiers[t].name + "_samples"] = st.tier_measured[t].samples;
        }
        return j.dump();
      },
  };
}

}  // namespace bs
