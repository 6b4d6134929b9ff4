package dist

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the rank if the launcher dies, so that a
// launcher killed by the user leaves no orphan ranks, and puts the rank in a
// process group of its own, so that the terminal's Ctrl-C reaches the ranks
// only through the launcher (Launch.Signals).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
