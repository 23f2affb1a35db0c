package policy

import (
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// Bash evaluates text as code in more places than command substitutions:
// arithmetic ($((x)), ((x)), let, for ((...)), [[ x -eq y ]], array
// subscripts, ${x:offset}) evaluates a variable's value as an expression,
// recursively, and a subscript in that value, such as a[$(cmd)], runs cmd;
// ${x@P} expands a value as a prompt, running the substitutions in it;
// ${!x} expands the variable a value names, subscript included. A line
// can assemble such a value from harmless pieces, so under an allow list
// these are refused unless made of literals. Whatever the rules, they may
// not assign a variable that steers the shell.

// evaluates checks node n where bash may evaluate text as code.
func (c *checker) evaluates(n syntax.Node) error {
	switch n := n.(type) {
	case *syntax.ArithmExp:
		return c.arithm(n, n.X)
	case *syntax.ArithmCmd:
		return c.arithm(n, n.X)
	case *syntax.LetClause:
		for _, e := range n.Exprs {
			if err := c.arithm(n, e); err != nil {
				return err
			}
		}
	case *syntax.CStyleLoop:
		for _, e := range []syntax.ArithmExpr{n.Init, n.Cond, n.Post} {
			if err := c.arithm(n, e); err != nil {
				return err
			}
		}
	case *syntax.BinaryArithm:
		if op := n.Op.String(); strings.HasSuffix(op, "=") && op != "==" && op != "!=" && op != "<=" && op != ">=" {
			return c.arithAssign(n, n.X)
		}
	case *syntax.UnaryArithm:
		if n.Op == syntax.Inc || n.Op == syntax.Dec {
			return c.arithAssign(n, n.X)
		}
	case *syntax.ParamExp:
		return c.paramExp(n)
	case *syntax.BinaryTest:
		if n.Op >= syntax.TsEql && n.Op <= syntax.TsGtr && c.allowList() && !(testNumber(n.X) && testNumber(n.Y)) {
			return c.refuseArith(n)
		}
	case *syntax.UnaryTest:
		return c.testVar(n)
	case *syntax.WordIter:
		return c.loopVar(n.Name)
	case *syntax.CoprocClause:
		if n.Name != nil && len(n.Name.Parts) == 1 {
			if lit, ok := n.Name.Parts[0].(*syntax.Lit); ok {
				return c.loopVar(lit)
			}
		}
	}
	return nil
}

func (c *checker) refuseArith(n syntax.Node) error {
	return c.refuse("%s cannot be checked: arithmetic on variables (bash evaluates a variable's value as code, and a[$(cmd)] in it runs cmd); under bash.allow arithmetic, subscripts and numeric tests take literal numbers only", shown(c.text(n)))
}

// arithm checks the arithmetic expression e of node n.
func (c *checker) arithm(n syntax.Node, e syntax.ArithmExpr) error {
	if e == nil || !c.allowList() || arithLiteral(e) {
		return nil
	}
	return c.refuseArith(n)
}

// arithAssign refuses arithmetic that assigns a variable steering the
// shell: ((PATH=1)) makes commands run from ./1.
func (c *checker) arithAssign(n syntax.Node, x syntax.ArithmExpr) error {
	w, ok := x.(*syntax.Word)
	if !ok || len(w.Parts) == 0 {
		return nil
	}
	lit, ok := w.Parts[0].(*syntax.Lit)
	if !ok {
		return nil
	}
	if name, _, _ := strings.Cut(lit.Value, "["); c.steers(name) {
		return c.refuse("%s: setting %s changes what commands run, which the rules cannot follow", shown(c.text(n)), name)
	}
	return nil
}

// loopVar refuses a for, select or coproc variable that steers the shell,
// or, under an allow list, one whose values bash evaluates.
func (c *checker) loopVar(name *syntax.Lit) error {
	switch {
	case name == nil:
	case c.steers(name.Value):
		return c.refuse("%s: setting %s changes what commands run, which the rules cannot follow", shown(c.text(name)), name.Value)
	case evaluatesValue(name.Value) && c.allowList():
		return c.refuseArith(name)
	}
	return nil
}

// paramExp checks one parameter expansion.
func (c *checker) paramExp(pe *syntax.ParamExp) error {
	if pe.Param != nil && pe.Exp != nil && (pe.Exp.Op == syntax.AssignUnset || pe.Exp.Op == syntax.AssignUnsetOrNull) {
		switch {
		case c.steers(pe.Param.Value):
			return c.refuse("%s: setting %s changes what commands run, which the rules cannot follow", shown(c.text(pe)), pe.Param.Value)
		case pe.Excl:
			return c.refuse("%s: it sets the variable a value names, which may be one that changes what commands run", shown(c.text(pe)))
		}
	}
	if !c.allowList() {
		return nil
	}
	switch {
	case pe.Excl && pe.Names == 0 && !atStar(pe.Index):
		return c.refuse("%s cannot be checked: indirect expansion expands the variable a value names, and bash evaluates a subscript in that name as arithmetic; under bash.allow it is refused", shown(c.text(pe)))
	case pe.Index != nil && !indexLiteral(pe.Index):
		return c.refuseArith(pe)
	case pe.Slice != nil && !(arithLiteral(pe.Slice.Offset) && arithLiteral(pe.Slice.Length)):
		return c.refuseArith(pe)
	case pe.Exp != nil && pe.Exp.Op == syntax.OtherParamOps && !harmlessTransform(pe.Exp.Word):
		return c.refuse("%s cannot be checked: the @P transformation expands a value as a prompt, which runs the command substitutions in it; under bash.allow only @Q, @E, @A, @K, @k, @a, @U, @u and @L are allowed", shown(c.text(pe)))
	}
	return nil
}

// harmlessTransform reports whether ${x@OP} only quotes, escapes or
// changes case: everything but P (prompt expansion).
func harmlessTransform(w *syntax.Word) bool {
	return w != nil && len(w.Parts) == 1 && len(w.Lit()) == 1 && strings.Contains("QEAKkaUuL", w.Lit())
}

// testVar checks [[ -v NAME ]] and [[ -R NAME ]] under an allow list:
// bash evaluates a subscript in NAME as arithmetic.
func (c *checker) testVar(ut *syntax.UnaryTest) error {
	w, ok := ut.X.(*syntax.Word)
	if !c.allowList() || !ok || ut.Op != syntax.TsVarSet && ut.Op != syntax.TsRefVar {
		return nil
	}
	ws, err := c.words([]*syntax.Word{w})
	if err != nil {
		return err
	}
	for _, sw := range ws {
		if !sw.literal() {
			return c.refuse("%s: the variable it looks up is only known when the line runs, and bash evaluates a subscript in it as arithmetic; quote a literal name", shown(c.text(ut)))
		}
		if err := c.setsVar(ut.Op.String(), sw, sw.text, true); err != nil {
			return err
		}
	}
	return nil
}

// atStar reports whether a subscript is @ or *: all the elements.
func atStar(e syntax.ArithmExpr) bool {
	w, ok := e.(*syntax.Word)
	return ok && (w.Lit() == "@" || w.Lit() == "*")
}

// indexLiteral reports whether a subscript evaluates no variable.
func indexLiteral(e syntax.ArithmExpr) bool { return atStar(e) || arithLiteral(e) }

// subscriptText is indexLiteral for a subscript given as text.
func subscriptText(s string) bool { return s == "@" || s == "*" || arithText(s) }

// arithLiteral reports whether an arithmetic expression is made of
// literal numbers and values known to be numbers ($#, ${#x}, ...).
func arithLiteral(e syntax.ArithmExpr) bool {
	switch e := e.(type) {
	case nil:
		return true
	case *syntax.BinaryArithm:
		return arithLiteral(e.X) && arithLiteral(e.Y)
	case *syntax.UnaryArithm:
		return e.Op != syntax.Inc && e.Op != syntax.Dec && arithLiteral(e.X)
	case *syntax.ParenArithm:
		return arithLiteral(e.X)
	case *syntax.Word:
		return numberWord(e.Parts)
	}
	return false
}

// testNumber reports whether an operand of -eq and the like is a number.
func testNumber(e syntax.TestExpr) bool {
	w, ok := e.(*syntax.Word)
	return ok && numberWord(w.Parts)
}

// numberWord reports whether the parts of a word can only make a number.
func numberWord(parts []syntax.WordPart) bool {
	for _, p := range parts {
		switch p := p.(type) {
		case *syntax.Lit:
			if !arithText(p.Value) {
				return false
			}
		case *syntax.DblQuoted:
			if !numberWord(p.Parts) {
				return false
			}
		case *syntax.ParamExp:
			if !numberParam(p) {
				return false
			}
		case *syntax.ArithmExp:
			// A number; its own expression is checked where it is.
		default:
			return false
		}
	}
	return true
}

// numberParam reports whether a parameter expansion is always a number:
// $#, $?, $$, $! and lengths.
func numberParam(pe *syntax.ParamExp) bool {
	switch {
	case pe.Param == nil || pe.Excl || pe.Exp != nil || pe.Repl != nil || pe.Slice != nil || pe.Names != 0:
		return false
	case pe.Length:
		return pe.Index == nil || indexLiteral(pe.Index)
	}
	switch pe.Param.Value {
	case "#", "?", "$", "!":
		return pe.Index == nil
	}
	return false
}

// arithText reports whether arithmetic text names no variable: numbers
// (42, 0x2a, 16#2a), operators and spaces only.
func arithText(s string) bool {
	for i := 0; i < len(s); {
		switch ch := s[i]; {
		case ch >= '0' && ch <= '9':
			for i < len(s) && (nameByte(s[i]) || s[i] == '#' || s[i] == '@') {
				i++
			}
		case strings.IndexByte(" \t\n+-*/%<>=!&|^~?:(),", ch) >= 0:
			i++
		default:
			return false
		}
	}
	return true
}
