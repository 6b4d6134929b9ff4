package dist

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the rank if the launcher dies, so that a
// launcher killed by the user leaves no orphan ranks.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
