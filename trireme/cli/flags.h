// A small command-line flag parser for the `trireme` subcommands.
//
// Flags are `--name VALUE` or `--name=VALUE`; boolean flags are `--name` alone. Each flag
// binds to a field of an options struct, so the knobs are read once into a struct. Errors
// are InvalidArgument with one line naming the flag and the fix:
//   unknown flag --stepz for 'trireme train'; run 'trireme train --help' for the flags
//   --steps expects an integer, got 'ten'
// A flag given twice takes its last value (a script's base flags, then overrides). A separate
// VALUE may not start with `--` (that is the next flag, and the value was forgotten);
// `--name=--x` gives such a value. An empty value (`--data ''`, `--data=`) is refused: it
// would read as the flag not given.
// Numbers are written plainly: an integer starts with a digit or '-', a real with a digit,
// '-' or '.'; leading spaces, '+' and hexadecimal (0x10) are refused.
// `--` ends flag parsing; what follows is returned as positional arguments.
// Which flags a parse saw is kept (given()), so that a flag given at its default value
// still counts as given: refused where it does not apply, or where a --plan sets it.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace trireme::cli {

class FlagParser {
 public:
  explicit FlagParser(std::string command) : command_(std::move(command)) {}

  void add(const std::string& name, int64_t* target, std::string help);
  void add(const std::string& name, int* target, std::string help);
  void add(const std::string& name, double* target, std::string help);
  void add(const std::string& name, std::string* target, std::string help);
  // A boolean switch: present means true.
  void add_switch(const std::string& name, bool* target, std::string help);

  // Parses args (not including the program or subcommand name). Returns the positional
  // arguments in order (everything after `--` is positional). Throws InvalidArgument.
  // With allow_unknown (a worker re-reading its command's arguments, which the command
  // checked in full), unknown flags are returned as positionals instead of refused.
  std::vector<std::string> parse(const std::vector<std::string>& args,
                                 bool allow_unknown = false) const;

  // True when the last parse() saw --help / -h.
  bool help_requested() const { return help_requested_; }
  // True when the last parse() saw --name (whatever its value, the default's too).
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  // Each parse() also writes the names of the flags it saw to *names (which must outlive
  // parsing): for checks made away from the parser, e.g. on an options struct.
  void record_given(std::set<std::string>* names) { given_sinks_.push_back(names); }
  std::string usage() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    bool is_switch = false;
    std::function<void(const std::string&)> set;
    std::string default_value;
  };
  const Flag* find(const std::string& name) const;

  std::string command_;
  std::vector<Flag> flags_;
  mutable bool help_requested_ = false;
  mutable std::set<std::string> given_;
  std::vector<std::set<std::string>*> given_sinks_;
};

// Parses "HOST:PORT" (port 0..65535). Throws InvalidArgument naming the flag.
void parse_host_port(const std::string& flag, const std::string& value, std::string* host,
                     int* port);

}  // namespace trireme::cli
