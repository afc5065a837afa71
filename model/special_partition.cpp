#include "model/special_partition.h"

#include <algorithm>
#include <map>

namespace bs {

SpecialPartition::SpecialPartition(std::vector<Special> specials) : specials_(std::move(specials)) {
  root_.fill(-1);
  // A trie with map children first, flattened after: node i keeps index i.
  std::vector<std::map<uint8_t, uint32_t>> children(1);
  std::vector<std::vector<uint32_t>> ends(1);
  for (uint32_t s = 0; s < specials_.size(); ++s) {
    uint32_t node = 0;
    for (unsigned char c : specials_[s].text) {
      auto it = children[node].find(c);
      if (it == children[node].end()) {
        it = children[node].emplace(c, static_cast<uint32_t>(children.size())).first;
        children.emplace_back();
        ends.emplace_back();
      }
      node = it->second;
    }
    if (node != 0) ends[node].push_back(s);  // an empty text cuts nothing
  }
  nodes_.resize(children.size());
  for (uint32_t n = 0; n < children.size(); ++n) {
    nodes_[n].edge_begin = static_cast<uint32_t>(edges_.size());
    for (const auto& [c, child] : children[n]) {
      if (n == 0)
        root_[c] = static_cast<int32_t>(child);
      else
        edges_.emplace_back(c, child);
    }
    nodes_[n].edge_end = static_cast<uint32_t>(edges_.size());
    nodes_[n].ends_begin = static_cast<uint32_t>(ends_.size());
    ends_.insert(ends_.end(), ends[n].begin(), ends[n].end());
    nodes_[n].ends_end = static_cast<uint32_t>(ends_.size());
  }
}

void SpecialPartition::occurring(std::string_view text, bool parse_special, std::vector<uint32_t>& found) const {
  found.clear();
  if (specials_.empty()) return;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    int32_t node = root_[p[i]];
    for (size_t j = i + 1; node >= 0; ++j) {
      const Node& nd = nodes_[static_cast<size_t>(node)];
      for (uint32_t e = nd.ends_begin; e < nd.ends_end; ++e)
        if (parse_special || specials_[ends_[e]].always) found.push_back(ends_[e]);
      if (j >= n) break;
      node = -1;
      for (uint32_t e = nd.edge_begin; e < nd.edge_end; ++e)
        if (edges_[e].first == p[j]) {
          node = static_cast<int32_t>(edges_[e].second);
          break;
        }
    }
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
}

void SpecialPartition::split(std::string_view text, bool parse_special,
                             std::vector<std::pair<size_t, int32_t>>& frags) const {
  struct Frag {
    size_t off, len;
    int32_t id;
  };
  frags.clear();
  if (text.empty()) return;
  thread_local std::vector<uint32_t> found;
  occurring(text, parse_special, found);
  std::vector<Frag> cur{{0, text.size(), -1}}, next;
  for (uint32_t s : found) {  // priority order: specials_ is in it
    const std::string& st = specials_[s].text;
    const int32_t sid = specials_[s].id;
    next.clear();
    for (const Frag& f : cur) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view window = text.substr(0, f.off + f.len);
      size_t pos = f.off;
      for (;;) {
        const size_t m = window.find(st, pos);
        if (m == std::string_view::npos) break;
        if (m > pos) next.push_back({pos, m - pos, -1});
        next.push_back({m, st.size(), sid});
        pos = m + st.size();
      }
      if (pos < f.off + f.len) next.push_back({pos, f.off + f.len - pos, -1});
    }
    cur.swap(next);
  }
  for (const Frag& f : cur) frags.emplace_back(f.off + f.len, f.id);
}

}  // namespace bs
