package doccheck_test

import (
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
)

// TestDocCommentsAreWhole checks that no paragraph of an exported
// declaration's documentation stops mid-sentence, as one did when a later
// paragraph was pasted into the middle of it.
func TestDocCommentsAreWhole(t *testing.T) {
	root := filepath.Join("..", "..") // the repository, every module of it
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
			return filepath.SkipDir
		}
		files, err := filepath.Glob(filepath.Join(path, "*.go"))
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				checkDecl(t, fset, decl)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func checkDecl(t *testing.T, fset *token.FileSet, decl ast.Decl) {
	var groups []*ast.CommentGroup
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if d.Name.IsExported() {
			groups = append(groups, d.Doc)
		}
	case *ast.GenDecl:
		groups = append(groups, d.Doc)
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if s.Name.IsExported() {
					groups = append(groups, s.Doc)
				}
			case *ast.ValueSpec:
				groups = append(groups, s.Doc)
			}
		}
	}
	var parse comment.Parser
	var print comment.Printer
	for _, g := range groups {
		if g == nil {
			continue
		}
		for _, block := range parse.Parse(g.Text()).Content {
			if _, ok := block.(*comment.Paragraph); !ok {
				continue
			}
			text := strings.TrimSpace(string(print.Text(&comment.Doc{Content: []comment.Block{block}})))
			if r := []rune(text); len(r) > 0 && unicode.IsLetter(r[len(r)-1]) {
				t.Errorf("%s: a doc paragraph ends mid-sentence: ...%s", fset.Position(g.Pos()), text[max(0, len(text)-60):])
			}
		}
	}
}
