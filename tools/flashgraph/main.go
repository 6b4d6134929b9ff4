// Command flashgraph compiles transformer graphs with (or without) the
// attention fusion, writes their canonical text, ONNX and DOT, runs them and
// trains them on the CPU or an NVIDIA GPU, and benchmarks the fused kernel.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// command is one subcommand of the CLI.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

// commands is filled by the cmd_*.go files' init functions.
var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

// errUsage marks an error that was already explained with usage text.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintln(w, "flashgraph: a graph compiler and executor for causal transformers, with a fused FlashAttention pass.")
	fmt.Fprintln(w, "\nUsage: flashgraph <command> [flags] [args]   (flags come before positional arguments)")
	fmt.Fprintln(w, "\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'flashgraph <command> -h' for a command's flags.")
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "flashgraph: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	// Help that was asked for is the command's output: it goes to stdout
	// (so that `flashgraph train -h | less` works); usage printed because of
	// a bad flag stays on stderr.
	errOut := stderr
	if asksHelp(args[1:]) {
		errOut = stdout
	}
	if err := c.run(args[1:], stdout, errOut); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		if se := (*signalError)(nil); errors.As(err, &se) {
			fmt.Fprintf(stderr, "flashgraph %s: %s\n", c.name, errorText(c.name, err))
			return se.exitCode()
		}
		fmt.Fprintf(stderr, "flashgraph %s: %s\n", c.name, errorText(c.name, err))
		return 1
	}
	return 0
}

// asksHelp reports whether the flags (before the first positional argument)
// ask for help.
func asksHelp(args []string) bool {
	for _, a := range args {
		if a == "--" || !strings.HasPrefix(a, "-") {
			return false
		}
		switch a {
		case "-h", "-help", "--h", "--help":
			return true
		}
	}
	return false
}

// errorText is err's message without a leading "name: ": packages prefix
// their errors with their own name (train, passes, ...), and when that is the
// command's name too the line would read "flashgraph train: train: ...".
func errorText(name string, err error) string {
	msg := err.Error()
	for {
		rest, ok := strings.CutPrefix(msg, name+": ")
		if !ok {
			return msg
		}
		msg = rest
	}
}

// newFlags makes a FlagSet whose usage text names the command and its arguments.
func newFlags(name, args, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\n%s\n\nFlags:\n", strings.TrimSpace("flashgraph "+name+" [flags] "+args), about)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses and turns flag errors into errUsage (the flag package
// already printed the problem and the usage).
func parseFlags(fs *flag.FlagSet, args []string, maxPositional int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > maxPositional {
		extra := fs.Args()[maxPositional:]
		for _, a := range extra {
			if strings.HasPrefix(a, "-") {
				fmt.Fprintf(fs.Output(), "flag %s comes after a positional argument: flags must come first\n", a)
				return errUsage
			}
		}
		fmt.Fprintf(fs.Output(), "unexpected arguments: %s\n", strings.Join(extra, " "))
		fs.Usage()
		return errUsage
	}
	return nil
}
