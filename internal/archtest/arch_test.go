package archtest

import (
	"bufio"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/flashgraph/flashgraph/"

// root is the repository root, two levels up from this package.
var root = filepath.Join("..", "..")

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rule is one line of the page's imports block.
type rule struct {
	allowed   map[string]bool
	temporary map[string]bool
}

// parseLayers reads the ```imports block: "pkg: dep dep; temporary: dep".
func parseLayers(t *testing.T, doc string) map[string]rule {
	t.Helper()
	start := strings.Index(doc, "```imports\n")
	if start < 0 {
		t.Fatal("docs/ARCHITECTURE.md has no ```imports block")
	}
	body := doc[start+len("```imports\n"):]
	end := strings.Index(body, "```")
	if end < 0 {
		t.Fatal("the ```imports block is not closed")
	}
	rules := map[string]rule{}
	sc := bufio.NewScanner(strings.NewReader(body[:end]))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		pkg, deps, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("imports block: line %q is not 'package: imports'", line)
		}
		if _, dup := rules[pkg]; dup {
			t.Fatalf("imports block lists %s twice", pkg)
		}
		r := rule{allowed: map[string]bool{}, temporary: map[string]bool{}}
		deps, temp, _ := strings.Cut(deps, "; temporary:")
		for _, d := range strings.Fields(deps) {
			if d != "-" {
				r.allowed[d] = true
			}
		}
		for _, d := range strings.Fields(temp) {
			r.temporary[d] = true
		}
		rules[pkg] = r
	}
	return rules
}

// packages maps each directory holding non-test Go files (relative to the
// root, slash-separated) to the module packages those files import.
func packages(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if out[pkg] == nil {
			out[pkg] = map[string]bool{}
		}
		for _, im := range f.Imports {
			p, err := strconv.Unquote(im.Path.Value)
			if err != nil {
				return err
			}
			if dep, ok := strings.CutPrefix(p, module); ok {
				out[pkg][dep] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestLayers(t *testing.T) {
	rules := parseLayers(t, readDoc(t))
	pkgs := packages(t)
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages under %s: wrong root?", len(pkgs), root)
	}
	for pkg, imports := range pkgs {
		r, ok := rules[pkg]
		if !ok {
			t.Errorf("package %s is not in docs/ARCHITECTURE.md's imports block", pkg)
			continue
		}
		for dep := range imports {
			if !r.allowed[dep] && !r.temporary[dep] {
				t.Errorf("%s imports %s, which docs/ARCHITECTURE.md does not allow", pkg, dep)
			}
		}
		for dep := range r.temporary {
			if imports[dep] {
				t.Logf("%s still imports %s (temporary)", pkg, dep)
			}
		}
	}
	for pkg := range rules {
		if _, ok := pkgs[pkg]; !ok {
			t.Errorf("docs/ARCHITECTURE.md lists %s, which is not a package here", pkg)
		}
	}
}

// TestLayersCatchAViolation makes sure the check can fail: an import the
// block does not allow is reported.
func TestLayersCatchAViolation(t *testing.T) {
	rules := parseLayers(t, "```imports\ngraph: -\npasses: graph; temporary: model\n```\n")
	if rules["graph"].allowed["passes"] || !rules["passes"].allowed["graph"] || !rules["passes"].temporary["model"] {
		t.Fatalf("parsed %+v", rules)
	}
}

var (
	testName = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")
	filePath = regexp.MustCompile("`([a-z0-9_./]+/[a-zA-Z0-9_.]+\\.(?:go|cu|golden|md))`")
)

// TestCitedNamesExist: every test and file the page names exists, so that
// "how to add an op" does not point at something renamed.
func TestCitedNamesExist(t *testing.T) {
	doc := readDoc(t)
	files := filePath.FindAllStringSubmatch(doc, -1)
	tests := testName.FindAllStringSubmatch(doc, -1)
	if len(files) < 5 || len(tests) < 5 {
		t.Fatalf("found %d files and %d tests cited: the patterns no longer match the page", len(files), len(tests))
	}
	for _, m := range files {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(m[1]))); err != nil {
			t.Errorf("docs/ARCHITECTURE.md cites %s: %v", m[1], err)
		}
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, m := range tests {
		if !defined[m[1]] {
			missing = append(missing, m[1])
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("docs/ARCHITECTURE.md names tests that do not exist: %v", slices.Compact(missing))
	}
}
