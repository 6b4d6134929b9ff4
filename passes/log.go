package passes

import (
	"fmt"
	"strings"
	"sync"
)

// EventKind says what an Event records.
type EventKind uint8

// Event kinds. Fired and Refused come from rules (the -explain material);
// Info carries pass summaries (what DCE removed, how a pass changed the
// graph); Warning is something a check found that is suspicious but legal.
const (
	Fired EventKind = iota + 1
	Refused
	Info
	Warning
)

var eventKindNames = map[EventKind]string{Fired: "fired", Refused: "refused", Info: "info", Warning: "warning"}

func (k EventKind) String() string { return eventKindNames[k] }

// Event is one line of a pass log.
type Event struct {
	Pass string
	Kind EventKind
	Rule string // the rule that fired or refused ("" when no rule matched at all)
	Node string // the node the rule was tried at (its root), or what an Info is about
	Op   string // that node's op
	// Reason says why a rule refused, or describes an Info/Warning.
	Reason string
	// Result names what a firing made (e.g. the FlashAttention node) and
	// Detail gives its key attributes, for -explain.
	Result string
	Detail string
}

func (e Event) String() string {
	var b strings.Builder
	b.WriteString(e.Pass + ": ")
	if e.Node != "" {
		b.WriteString(e.Node)
		if e.Op != "" {
			b.WriteString(" (" + e.Op + ")")
		}
		b.WriteString(": ")
	}
	switch e.Kind {
	case Fired:
		b.WriteString("fired " + e.Rule)
		if e.Result != "" {
			b.WriteString(" -> " + e.Result)
		}
		if e.Detail != "" {
			b.WriteString(" " + e.Detail)
		}
	case Refused:
		if e.Rule != "" {
			b.WriteString("refused " + e.Rule + ": ")
		} else {
			b.WriteString("no rule matched: ")
		}
		b.WriteString(e.Reason)
	default:
		b.WriteString(e.Kind.String() + ": " + e.Reason)
	}
	return b.String()
}

// Log collects what passes did and refused to do. A nil *Log is valid and
// records nothing, so callers that do not care pass nil. It is safe for
// concurrent use (passes of one pipeline run in order, but tools may share a
// log between pipelines).
type Log struct {
	mu     sync.Mutex
	events []Event
}

// Add appends an event.
func (l *Log) Add(e Event) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// Infof records an Info event of pass.
func (l *Log) Infof(pass, format string, args ...any) {
	l.Add(Event{Pass: pass, Kind: Info, Reason: fmt.Sprintf(format, args...)})
}

// Events returns a copy of the events in the order they happened.
func (l *Log) Events() []Event {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// Filter returns the events of one pass ("" for all) and one kind (0 for all).
func (l *Log) Filter(pass string, kind EventKind) []Event {
	var out []Event
	for _, e := range l.Events() {
		if (pass == "" || e.Pass == pass) && (kind == 0 || e.Kind == kind) {
			out = append(out, e)
		}
	}
	return out
}

// String is the whole log, one event a line.
func (l *Log) String() string {
	var b strings.Builder
	for _, e := range l.Events() {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}
