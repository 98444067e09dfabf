package doccheck_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSlotsDocFitsOnAPage keeps package slots' documentation, as
// `go doc -all ./slots` prints it, within 450 lines, and the Transport's
// comment within 12: the package is read first, and its rules belong in
// a few sentences, with the mechanics in tests' comments.
func TestSlotsDocFitsOnAPage(t *testing.T) {
	root := filepath.Join("..", "..")
	all := goDoc(t, root, "-all", "./slots")
	if n := strings.Count(all, "\n"); n > 450 {
		t.Errorf("go doc -all ./slots is %d lines, more than 450", n)
	}
	tr := goDoc(t, root, "./slots.Transport")
	var comment int
	for _, line := range strings.Split(tr, "\n") {
		if strings.HasPrefix(line, "func ") {
			break
		}
		if strings.HasPrefix(line, "    ") {
			comment++
		}
	}
	if comment == 0 || comment > 12 {
		t.Errorf("the Transport's comment is %d lines, want 1 to 12:\n%s", comment, tr)
	}
}

func goDoc(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"doc"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go doc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
