// Package archtest keeps docs/ARCHITECTURE.md honest: its test checks the
// layer list against the imports of every package and that every file and
// test the page names exists. It has no code of its own.
package archtest
