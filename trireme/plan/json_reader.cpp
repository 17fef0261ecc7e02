#include "trireme/plan/json_reader.h"

#include <fstream>
#include <sstream>

#include "trireme/common/error.h"

namespace trireme::plan {

nlohmann::json Field::parse(const std::string& text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TRIREME_THROW(InvalidArgument, origin, ": not valid JSON (", e.what(), ")");
  }
}

std::string Field::shown() const {
  std::string text = value_->dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

void Field::fail(const std::string& problem) const {
  TRIREME_THROW(InvalidArgument, origin_, ": ", path_.empty() ? "the top level" : path_, " ",
                problem);
}

bool Field::has(const std::string& key) const {
  return value_->is_object() && value_->contains(key);
}

Field Field::at(const std::string& key) const {
  if (!value_->is_object()) fail("must be an object (got " + shown() + ")");
  const std::string child = path_.empty() ? key : path_ + "." + key;
  if (!value_->contains(key))
    TRIREME_THROW(InvalidArgument, origin_, ": ", child, " is missing; add it");
  return Field(value_->at(key), child, origin_);
}

std::vector<Field> Field::items() const {
  if (!value_->is_array()) fail("must be an array (got " + shown() + ")");
  std::vector<Field> out;
  for (size_t i = 0; i < value_->size(); ++i)
    out.emplace_back((*value_)[i], path_ + "[" + std::to_string(i) + "]", origin_);
  return out;
}

std::string Field::str() const {
  if (!value_->is_string()) fail("must be a string (got " + shown() + ")");
  return value_->get<std::string>();
}

bool Field::boolean() const {
  if (!value_->is_boolean()) fail("must be true or false (got " + shown() + ")");
  return value_->get<bool>();
}

double Field::number() const {
  if (!value_->is_number()) fail("must be a number (got " + shown() + ")");
  return value_->get<double>();
}

double Field::positive() const {
  if (!value_->is_number() || !(value_->get<double>() > 0))
    fail("must be a positive number (got " + shown() + ")");
  return value_->get<double>();
}

double Field::non_negative() const {
  if (!value_->is_number() || !(value_->get<double>() >= 0))
    fail("must be a number >= 0 (got " + shown() + ")");
  return value_->get<double>();
}

int64_t Field::integer(int64_t min_value) const {
  // (An unsigned value past int64's range would read back negative.)
  const bool too_large = value_->is_number_unsigned() &&
                         value_->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!value_->is_number_integer() || too_large || value_->get<int64_t>() < min_value)
    fail("must be an integer >= " + std::to_string(min_value) + (too_large ? " that fits in 64 bits" : "") +
         " (got " + shown() + ")");
  return value_->get<int64_t>();
}

int Field::bounded(int64_t min_value, int64_t max_value) const {
  const int64_t value = integer(min_value);
  if (value > max_value)
    fail("must be an integer >= " + std::to_string(min_value) + " and <= " + std::to_string(max_value) + " (got " +
         shown() + ")");
  return static_cast<int>(value);
}

std::string Field::str_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? at(key).str() : fallback;
}
double Field::positive_or(const std::string& key, double fallback) const {
  return has(key) ? at(key).positive() : fallback;
}
double Field::non_negative_or(const std::string& key, double fallback) const {
  return has(key) ? at(key).non_negative() : fallback;
}
int64_t Field::integer_or(const std::string& key, int64_t min_value, int64_t fallback) const {
  return has(key) ? at(key).integer(min_value) : fallback;
}
int Field::bounded_or(const std::string& key, int64_t min_value, int fallback) const {
  return has(key) ? at(key).bounded(min_value) : fallback;
}
bool Field::boolean_or(const std::string& key, bool fallback) const {
  return has(key) ? at(key).boolean() : fallback;
}

void Field::only(const std::vector<std::string>& known) const {
  if (!value_->is_object()) fail("must be an object (got " + shown() + ")");
  for (const auto& item : value_->items()) {
    bool found = false;
    for (const auto& k : known) found = found || k == item.key();
    if (found) continue;
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    TRIREME_THROW(InvalidArgument, origin_, ": ", path_.empty() ? "" : path_ + ".", item.key(),
                  " is not a known field; the fields here are: ", list);
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  TRIREME_CHECK(in.good(), "cannot read ", path, "; check the path");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::ordered_json model_json(const models::GptConfig& m) {
  return {{"vocab", m.vocab},   {"seq_len", m.seq_len}, {"layers", m.layers},
          {"dim", m.dim},       {"heads", m.heads},     {"mlp_ratio", m.mlp_ratio}};
}

models::GptConfig read_model(const Field& f) {
  f.only({"vocab", "seq_len", "layers", "dim", "heads", "mlp_ratio"});
  models::GptConfig m;
  m.vocab = f.at("vocab").integer(1);
  m.seq_len = f.at("seq_len").integer(1);
  m.layers = f.at("layers").bounded(1, std::numeric_limits<int>::max() - 2);  // + embeddings and head
  m.dim = f.at("dim").integer(1);
  m.heads = f.at("heads").integer(1);
  m.mlp_ratio = f.integer_or("mlp_ratio", 1, 4);
  return m;
}

}  // namespace trireme::plan
