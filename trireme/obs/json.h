// Minimal JSON writing for metrics lines and traces: an ordered list of key/value fields
// written as one object. Numbers keep enough digits to round-trip a double (%.17g is exact;
// losses are written with %.10g, >= 9 significant digits, as metrics.jsonl promises).
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

std::string json_escape(const std::string& text);
// Escapes <, >, & and " for SVG/XML text and attribute values, and replaces the control
// characters XML forbids (all below 0x20 but tab, newline, CR) by U+FFFD.
std::string xml_escape(const std::string& text);
std::string json_number(double value);

}  // namespace trireme::obs
