#include "trireme/cli/flags.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "trireme/common/error.h"

namespace trireme::cli {
namespace {

// strtoll and strtod also take leading spaces, '+' and (strtod) hexadecimal: refused, so
// that a value reads the same to a person as to the parser.
// Values outside [min, max] are refused naming the range.
int64_t parse_integer(const std::string& flag, const std::string& text, int64_t min = INT64_MIN,
                      int64_t max = INT64_MAX) {
  const bool plain = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-');
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  const int error = errno;
  TRIREME_CHECK(plain && end && *end == '\0' && end != text.c_str(), "--", flag, " expects an integer, got '", text,
                "'");
  TRIREME_CHECK(error != ERANGE && value >= min && value <= max, "--", flag, " is out of range: ", text,
                "; give an integer in ", min, "..", max);
  return value;
}

double parse_real(const std::string& flag, const std::string& text) {
  const bool plain = !text.empty() && text.find_first_of("xX") == std::string::npos &&
                     (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' || text[0] == '.');
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const int error = errno;
  TRIREME_CHECK(plain && end && *end == '\0' && end != text.c_str() && (std::isfinite(value) || error == ERANGE),
                "--", flag, " expects a finite number, got '", text, "'");
  TRIREME_CHECK(error != ERANGE, "--", flag, " is out of range: ", text,
                "; give a number of magnitude from 1e-307 to 1e308, or 0");
  return value;
}

}  // namespace

void FlagParser::add(const std::string& name, int64_t* target, std::string help) {
  flags_.push_back({name, std::move(help), false,
                    [name, target](const std::string& v) { *target = parse_integer(name, v); },
                    std::to_string(*target)});
}

void FlagParser::add(const std::string& name, int* target, std::string help) {
  flags_.push_back({name, std::move(help), false,
                    [name, target](const std::string& v) {
                      *target = static_cast<int>(parse_integer(name, v, INT32_MIN, INT32_MAX));
                    },
                    std::to_string(*target)});
}

void FlagParser::add(const std::string& name, double* target, std::string help) {
  std::ostringstream def;
  def << *target;
  flags_.push_back({name, std::move(help), false,
                    [name, target](const std::string& v) { *target = parse_real(name, v); },
                    def.str()});
}

void FlagParser::add(const std::string& name, std::string* target, std::string help) {
  flags_.push_back({name, std::move(help), false,
                    [target](const std::string& v) { *target = v; }, *target});
}

void FlagParser::add_switch(const std::string& name, bool* target, std::string help) {
  flags_.push_back(
      {name, std::move(help), true, [target](const std::string&) { *target = true; }, ""});
}

const FlagParser::Flag* FlagParser::find(const std::string& name) const {
  for (const auto& flag : flags_)
    if (flag.name == name) return &flag;
  return nullptr;
}

std::vector<std::string> FlagParser::parse(const std::vector<std::string>& args,
                                           bool allow_unknown) const {
  help_requested_ = false;
  given_.clear();
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = find(name);
    if (!flag) {
      if (allow_unknown) {
        positional.push_back(arg);
        continue;
      }
      TRIREME_THROW(InvalidArgument, "unknown flag --", name, " for '", command_, "'; run '",
                    command_, " --help' for the flags");
    }
    given_.insert(name);
    if (flag->is_switch) {
      TRIREME_CHECK(!has_value, "--", name, " is a switch and takes no value");
      flag->set("");
      continue;
    }
    if (!has_value) {
      TRIREME_CHECK(i + 1 < args.size(), "--", name, " needs a value");
      // A missing value must not take the next flag as its own (--dump-params --quiet).
      TRIREME_CHECK(args[i + 1].rfind("--", 0) != 0, "--", name, " needs a value but is followed by ", args[i + 1],
                    "; give the value (for one that starts with --, write --", name, "=VALUE)");
      value = args[++i];
    }
    // (An empty value would read as the flag not given: its default.)
    TRIREME_CHECK(!value.empty(), "--", name, " needs a value, got an empty one; give --", name,
                  " VALUE, or leave the flag out for its default");
    flag->set(value);
  }
  for (std::set<std::string>* sink : given_sinks_) *sink = given_;
  return positional;
}

std::string FlagParser::usage() const {
  std::ostringstream out;
  out << "flags of '" << command_ << "':\n";
  for (const auto& flag : flags_) {
    std::string left = "  --" + flag.name + (flag.is_switch ? "" : " VALUE");
    if (left.size() < 28) left.resize(28, ' ');
    out << left << " " << flag.help;
    // (Not when the help says it already, nor -1, which stands for "chosen for you".)
    if (!flag.is_switch && !flag.default_value.empty() && flag.default_value != "-1" &&
        flag.help.find("default") == std::string::npos)
      out << " (default " << flag.default_value << ")";
    out << "\n";
  }
  return out.str();
}

void parse_host_port(const std::string& flag, const std::string& value, std::string* host,
                     int* port) {
  const auto colon = value.rfind(':');
  TRIREME_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < value.size(), "--",
                flag, " expects HOST:PORT, got '", value, "'");
  const int64_t p = parse_integer(flag, value.substr(colon + 1));
  TRIREME_CHECK(p >= 0 && p <= 65535, "--", flag, " port must be 0..65535, got ", p);
  *host = value.substr(0, colon);
  *port = static_cast<int>(p);
}

}  // namespace trireme::cli
