#include "runner_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

namespace flashcute {
namespace runner {
namespace {

bool parse_int(const std::string& text, int64_t min, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < min) return false;
  *out = value;
  return true;
}

bool parse_float(const std::string& text, float* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const float value = std::strtof(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(value)) return false;
  *out = value;
  return true;
}

// A flag that takes a value: parses it into the options or says why it cannot.
using ValueParser = std::function<bool(const std::string&, Options*)>;

template <typename T>
ValueParser integer(T Options::*field, int64_t min) {
  return [field, min](const std::string& text, Options* o) {
    int64_t value;
    if (!parse_int(text, min, &value)) return false;
    o->*field = static_cast<T>(value);
    return true;
  };
}

ValueParser real(float Options::*field) {
  return [field](const std::string& text, Options* o) { return parse_float(text, &(o->*field)); };
}

template <typename T>
ValueParser choice(T Options::*field, std::map<std::string, T> names) {
  return [field, names](const std::string& text, Options* o) {
    const auto it = names.find(text);
    if (it == names.end()) return false;
    o->*field = it->second;
    return true;
  };
}

const std::map<std::string, ValueParser>& value_flags() {
  static const std::map<std::string, ValueParser> flags = {
      {"--dtype", choice(&Options::dtype, {{"BFloat16", FC_BFLOAT16}, {"Float16", FC_FLOAT16}})},
      {"--batch_size", integer(&Options::batch_size, 0)},
      {"--seqlen_q", integer(&Options::seqlen_q, 0)},
      {"--seqlen_k", integer(&Options::seqlen_k, 0)},
      {"--num_head", integer(&Options::num_head, 1)},
      {"--head_dim", integer(&Options::head_dim, 1)},
      {"--softmax_scale", real(&Options::softmax_scale)},
      {"--m_block_size", integer(&Options::m_block_size, 1)},
      {"--n_block_size", integer(&Options::n_block_size, 1)},
      {"--num_threads", integer(&Options::num_threads, 1)},
      {"--warmup_iterations", integer(&Options::warmup_iterations, 0)},
      {"--iterations", integer(&Options::iterations, 1)},
      {"--family",
       choice(&Options::family,
              {{"auto", FC_FAMILY_AUTO}, {"sm80", FC_FAMILY_SM80}, {"sm90", FC_FAMILY_SM90}})},
      {"--causal_alignment",
       choice(&Options::causal_alignment,
              {{"top_left", FC_CAUSAL_TOP_LEFT}, {"bottom_right", FC_CAUSAL_BOTTOM_RIGHT}})},
      {"--num_head_k", integer(&Options::num_head_k, 1)},
      {"--window_left", integer(&Options::window_left, -1)},
      {"--window_right", integer(&Options::window_right, -1)},
      {"--softcap", real(&Options::softcap)},
  };
  return flags;
}

const std::map<std::string, bool Options::*>& switch_flags() {
  static const std::map<std::string, bool Options::*> flags = {
      {"--is_causal", &Options::is_causal},
      {"--skip_ref_check", &Options::skip_ref_check},
      {"--use_cold_l2", &Options::use_cold_l2},
      {"--auto_tile", &Options::auto_tile},
      {"--alibi", &Options::alibi},
      {"--varlen", &Options::varlen},
      {"--lse", &Options::lse},
      {"--help", &Options::help},
  };
  return flags;
}

}  // namespace

bool parse_options(int argc, const char* const* argv, Options* options, std::string* error) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    bool has_value = false;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {  // --flag=value
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag == "--integer_inputs" && !has_value) {
      o.inputs = InputKind::kInteger;
      continue;
    }
    const auto s = switch_flags().find(flag);
    if (s != switch_flags().end() && !has_value) {
      o.*(s->second) = true;
      continue;
    }
    const auto v = value_flags().find(flag);
    if (v == value_flags().end()) {
      *error = "unknown option '" + std::string(argv[i]) + "'";
      return false;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        *error = "option " + flag + " needs a value";
        return false;
      }
      value = argv[++i];
    }
    if (!v->second(value, &o)) {
      *error = "bad value '" + value + "' for " + flag;
      return false;
    }
  }
  if (o.softcap < 0) {
    *error = "bad value for --softcap: must be >= 0";
    return false;
  }
  *options = o;
  return true;
}

std::string usage() {
  return "usage: flashcute_run [options]\n"
         "  --dtype BFloat16|Float16 (BFloat16)   --batch_size N (4)   --seqlen_q N (8192)\n"
         "  --seqlen_k N (8192)   --num_head N (16)   --num_head_k N (= num_head)\n"
         "  --head_dim N (128)   --softmax_scale X (0.5)   --is_causal\n"
         "  --causal_alignment top_left|bottom_right (top_left)\n"
         "  --window_left N (-1)   --window_right N (-1)   --softcap X (0 = off)   --alibi\n"
         "  --varlen   --lse   --integer_inputs\n"
         "  --family auto|sm80|sm90 (auto)   --m_block_size N (128)   --n_block_size N (64)\n"
         "  --num_threads N (128)   --auto_tile\n"
         "  --warmup_iterations N (3)   --iterations N (10)   --skip_ref_check   --use_cold_l2\n";
}

}  // namespace runner
}  // namespace flashcute
