// Shared by the blend tests: a small RAG set (four documents and a question whose
// answer is in the first) and its prompt assembly.
#pragma once

#include <string>
#include <vector>

#include "blend/rag_prompt.h"
#include "model/llama_model.h"

namespace bs::testing {

inline const std::vector<std::string> kDocs = {
    "The Velmor Bridge crosses the river Asta in the town of Kirrin. Its construction began in 1861 under the "
    "engineer Hanna Ostrow and the bridge was completed in 1873. It is 212 metres long and carries both a road "
    "and a railway line.",
    "Dr. Elias Brandt founded the Brandt Optical Works in 1902 in the city of Lorvik. The company first made "
    "lenses for lighthouses and later built telescopes for several observatories in the north.",
    "The annual Kirrin harvest festival takes place on the second Sunday of September. Visitors eat plum cake, "
    "watch the boat race on the Asta, and the mayor opens the festival at noon by ringing the old bell.",
    "Mount Terav is the highest peak of the Selden range, at 3,412 metres. The first recorded ascent was made in "
    "1898 by the climbers Ada Finch and Jonas Weil, who reached the summit from the eastern ridge.",
};
inline const std::string kQuestion = "In which year was the Velmor Bridge completed? Answer with the year only.";

inline RagPrompt make_prompt(const LlamaModel& m, const std::vector<std::string>& docs, const std::string& q = kQuestion) {
  return assemble_rag_prompt(m.tokenizer(), m.chat_template(), {{"user", q}}, docs);
}

}  // namespace bs::testing
