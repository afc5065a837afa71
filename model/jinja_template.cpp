#include "model/jinja_template.h"

#include <ctime>
#include <stdexcept>

#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "jinja/value.h"
#include "json.h"

namespace bs {

struct JinjaTemplate::Impl {
  std::string source;  // as the lexer normalized it (the engine's error messages quote it)
  jinja::program program;
};

JinjaTemplate::JinjaTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  try {
    jinja::lexer lexer;
    const auto tokens = lexer.tokenize(source);
    impl_->program = jinja::parse_from_tokens(tokens);
    impl_->source = tokens.source;
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("chat template: ") + e.what());
  }
}

JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

std::string JinjaTemplate::render(const std::string& context_json) const {
  try {
    jinja::context ctx(impl_->source);
    ctx.current_time = std::time(nullptr);  // strftime_now
    jinja::global_from_json(ctx, common_json::parse(context_json), /*mark_input=*/false);
    jinja::runtime runtime(ctx);
    const jinja::value results = runtime.execute(impl_->program);
    return jinja::runtime::gather_string_parts(results)->as_string().str();
  } catch (const std::exception& e) {
    // raise_exception's message reaches here inside the engine's report of where it was
    // raised ("... Error: Jinja Exception: MESSAGE").
    const std::string what = e.what();
    constexpr std::string_view kRaised = "Jinja Exception: ";
    if (const size_t at = what.rfind(kRaised); at != std::string::npos)
      throw TemplateRaised(what.substr(at + kRaised.size()));
    throw std::invalid_argument(std::string("chat template: ") + e.what());
  }
}

}  // namespace bs
