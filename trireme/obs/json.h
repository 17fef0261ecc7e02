// Minimal JSON writing for metrics lines and traces: an ordered list of key/value fields
// written as one object. Numbers are written with %.10g: ten significant digits (>= 9, as
// metrics.jsonl promises for losses), not enough to round-trip every double.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace trireme::obs {

class JsonObject {
 public:
  JsonObject& add(const std::string& key, double value);
  JsonObject& add(const std::string& key, int64_t value);
  JsonObject& add(const std::string& key, int value) { return add(key, int64_t{value}); }
  JsonObject& add(const std::string& key, const std::string& value);
  JsonObject& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const std::string& key, bool value);
  // A value already serialised as JSON (a nested object or array).
  JsonObject& add_raw(const std::string& key, std::string json);

  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // key -> serialised value
};

// A JSON string literal, quotes included. Bytes that are not well-formed UTF-8 (Latin-1
// text, a cut sequence) become U+FFFD, one per byte, so the output is valid UTF-8.
std::string json_escape(const std::string& text);
// Escapes <, >, & and " for SVG/XML text and attribute values, and replaces the control
// characters XML forbids (all below 0x20 but tab, newline, CR) and bytes that are not
// well-formed UTF-8 by U+FFFD.
std::string xml_escape(const std::string& text);
std::string json_number(double value);

}  // namespace trireme::obs
