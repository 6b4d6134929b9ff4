//go:build !linux

package dist

import "os/exec"

// dieWithParent has no portable form outside Linux; Run still kills the
// ranks on every path it controls.
func dieWithParent(*exec.Cmd) {}
