// Reading JSON files that people write by hand (cluster descriptions, plans, profiles)
// with errors that name the file and the JSON path of the bad field, e.g.
//   cluster.json: groups[1].inter_bandwidth_gbps must be a positive number (got -5)
//
// A Field is a value and its path; required members throw when missing, optional ones
// return a fallback. Every number is checked for type and range where it is read.
// Pure: nlohmann::json, no libtorch.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "trireme/models/gpt_config.h"

namespace trireme::plan {

class Field {
 public:
  Field(const nlohmann::json& value, std::string path, std::string origin)
      : value_(&value), path_(std::move(path)), origin_(std::move(origin)) {}

  // Parses `text` (throws InvalidArgument "ORIGIN: not valid JSON: ...").
  static nlohmann::json parse(const std::string& text, const std::string& origin);

  const std::string& path() const { return path_; }
  const nlohmann::json& json() const { return *value_; }
  bool has(const std::string& key) const;
  Field at(const std::string& key) const;  // required member of an object
  std::vector<Field> items() const;        // elements of a required array

  std::string str() const;
  bool boolean() const;
  double number() const;
  double positive() const;      // > 0
  double non_negative() const;  // >= 0
  int64_t integer(int64_t min_value) const;
  // An integer that the reader keeps in an int: in [min_value, max_value], or the error
  // names the field ("layout.dp must be an integer >= 1 and <= 2147483647 (got ...)").
  int bounded(int64_t min_value, int64_t max_value = std::numeric_limits<int>::max()) const;

  std::string str_or(const std::string& key, const std::string& fallback) const;
  double positive_or(const std::string& key, double fallback) const;
  double non_negative_or(const std::string& key, double fallback) const;
  int64_t integer_or(const std::string& key, int64_t min_value, int64_t fallback) const;
  int bounded_or(const std::string& key, int64_t min_value, int fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;

  // Throws InvalidArgument "ORIGIN: PATH <problem>".
  [[noreturn]] void fail(const std::string& problem) const;
  // Throws when the object has a member not in `known` (a misspelt field is an error, not
  // silently ignored).
  void only(const std::vector<std::string>& known) const;

 private:
  std::string shown() const;  // the value as JSON, shortened
  const nlohmann::json* value_;
  std::string path_;
  std::string origin_;
};

std::string read_text_file(const std::string& path);

// The model's shape as profiles and plans write it: {"vocab", "seq_len", "layers", "dim",
// "heads", "mlp_ratio"}.
nlohmann::ordered_json model_json(const models::GptConfig& model);
models::GptConfig read_model(const Field& field);

}  // namespace trireme::plan
