package train

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// CheckOutputFile refuses an output path that names a folder before any work
// is done (the rename at the end would fail with a message about a temp file).
func CheckOutputFile(flag, path string) error {
	if path == "" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s %s: is a folder; give a file name (for example %s)", flag, path, filepath.Join(path, "graph.txt"))
	}
	return nil
}

// WriteOutputFile writes the output file of flag through a temp file and a
// rename, so that a failed write never leaves half a file where a good one
// was. Errors name the flag and the file, not the temp file.
func WriteOutputFile(flag, path string, data []byte) error {
	if err := CheckOutputFile(flag, path); err != nil {
		return err
	}
	err := checkpoint.WriteFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return nil
}
