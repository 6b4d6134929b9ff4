package onnxpb

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// Load reads and decodes the model at path and brings in any tensor data stored in
// external files next to it.
func Load(path string) (*Model, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := m.LoadExternalData(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// LoadExternalData reads the bytes of every tensor whose data_location is
// EXTERNAL (initializers and tensors in attributes, in subgraphs too) into
// raw_data, and marks it as stored inline. Locations are relative to dir, the
// model's directory; a location that is absolute or leaves dir (by "..", or by a
// symbolic link pointing outside) is refused, because a model file must not be
// able to make us read arbitrary files.
func (m *Model) LoadExternalData(dir string) error {
	if m.Graph == nil {
		return nil
	}
	var root *os.Root
	defer func() {
		if root != nil {
			root.Close()
		}
	}()
	return visitTensors(m.Graph, func(t *Tensor) error {
		if t.DataLocation != LocationExternal {
			return nil
		}
		if root == nil {
			var err error
			if root, err = os.OpenRoot(dir); err != nil {
				return fmt.Errorf("tensor %q: external data: %w", t.Name, err)
			}
		}
		return loadExternal(root, t)
	})
}

func visitTensors(g *Graph, fn func(*Tensor) error) error {
	for _, t := range g.Initializer {
		if err := fn(t); err != nil {
			return err
		}
	}
	for _, n := range g.Node {
		for _, a := range n.Attribute {
			if a.T != nil {
				if err := fn(a.T); err != nil {
					return err
				}
			}
			for _, t := range a.Tensors {
				if err := fn(t); err != nil {
					return err
				}
			}
			if a.G != nil {
				if err := visitTensors(a.G, fn); err != nil {
					return err
				}
			}
			for _, sg := range a.Graphs {
				if err := visitTensors(sg, fn); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func loadExternal(root *os.Root, t *Tensor) error {
	var location string
	offset, length := int64(0), int64(-1)
	for _, e := range t.ExternalData {
		var err error
		switch e.Key {
		case "location":
			location = e.Value
		case "offset":
			offset, err = strconv.ParseInt(e.Value, 10, 64)
		case "length":
			length, err = strconv.ParseInt(e.Value, 10, 64)
		}
		if err != nil || offset < 0 || (e.Key == "length" && length < 0) {
			return fmt.Errorf("tensor %q: external data %s=%q is not a non-negative integer", t.Name, e.Key, e.Value)
		}
	}
	if location == "" {
		return fmt.Errorf("tensor %q: external data has no location", t.Name)
	}
	rel := filepath.FromSlash(location)
	if !filepath.IsLocal(rel) {
		return fmt.Errorf("tensor %q: external data location %q is outside the model's directory", t.Name, location)
	}
	n, err := t.NumElements()
	if err != nil {
		return err
	}
	size := t.DataType.ElemSize()
	if size == 0 {
		return fmt.Errorf("tensor %q: external data for %v elements is not supported", t.Name, t.DataType)
	}
	want := int64(n) * int64(size)
	if length >= 0 && length != want {
		return fmt.Errorf("tensor %q: external data length %d, want %d bytes for %v × %v", t.Name, length, want, t.Dims, t.DataType)
	}
	// os.Root resolves the path without ever leaving the directory, symlinks included.
	f, err := root.Open(rel)
	if err != nil {
		return fmt.Errorf("tensor %q: external data: %w", t.Name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("tensor %q: external data: %w", t.Name, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("tensor %q: external data %q is not a regular file", t.Name, location)
	}
	if offset > st.Size() || st.Size()-offset < want {
		return fmt.Errorf("tensor %q: external data %q has %d bytes, need %d at offset %d", t.Name, location, st.Size(), want, offset)
	}
	if length < 0 && st.Size()-offset != want {
		// Without a length the rest of the file is the tensor; a mismatch means the
		// dims and the file disagree.
		return fmt.Errorf("tensor %q: external data %q has %d bytes after offset %d, want %d", t.Name, location, st.Size()-offset, offset, want)
	}
	buf := make([]byte, want)
	if _, err := f.ReadAt(buf, offset); err != nil && !(errors.Is(err, io.EOF) && want == 0) {
		return fmt.Errorf("tensor %q: external data: %w", t.Name, err)
	}
	t.RawData = buf
	t.DataLocation = LocationDefault
	t.ExternalData = nil
	return nil
}
