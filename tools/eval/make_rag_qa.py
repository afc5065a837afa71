#!/usr/bin/env python3
"""Synthetic multi-document RAG QA set for blendserve (quality evals of full/prefix/reuse/blend).

Writes JSON lines, one case per line:

    {"id": "rag-0000", "hops": 1|2, "relation": "...", "gold_doc": [i] | [i_first_hop, i_answer],
     "question": "...", "answers": ["...", ...], "documents": [6 strings]}

Every fact is fictional (people, companies, towns, rivers, landmarks, inventions), stated
plainly in one sentence ("The Velmor Bridge was completed in 1873."), and each question asks
for it with the same words ("In which year was the Velmor Bridge completed?"), so that even a
small chat model can answer the single-hop cases by reading.  Multi-hop cases (30%) chain two
documents through a bridge entity: document A says "Dravik Optics was founded by Clara
Osterby in 1887.", document B says "Clara Osterby was born in Tarnwick in 1851.", and the
question is "In which town was the founder of Dravik Optics born?".

Each document opens with a lead paragraph that holds all of its entity's facts (as an
encyclopedia article would), followed by one or two paragraphs of templated background prose
(dates, numbers and names that are never asked about).

Distractors are look-alikes: documents of the same kind (another company founded by another
person in another year, sometimes sharing a name root with the gold entity), and for multi-hop
cases a complete look-alike chain (another company plus its founder's biography).

Guarantees (checked here for every case, re-checked by tests/test_rag_dataset.cpp):
  * 6 documents, each MIN_CHARS..MAX_CHARS characters, ASCII only (the committed file:
    1487..1867 characters = 313..450 SmolLM2 tokens, measured with blendserve's tokenizer;
    3.9..4.9 characters per token);
  * every answer string (all aliases) occurs in the answer document (gold_doc[-1]) and in no
    other document of the case (plain substring test, case-sensitive);
  * the question's subject occurs in gold_doc[0] and in no other document;
  * for 2-hop cases the bridge entity occurs in both gold documents and in no other;
  * no answer starts with "Yes"/"yes"/"No"/"no" (CacheBlend's parse_generation maps a
    prediction whose first word starts with those to "Yes"/"No");
  * the answer document's slot is balanced over the 6 positions.

Deterministic: fixed seed, stdlib only, never iterates a set; running it again produces a
byte-identical file (check with sha256sum or --check). Generated with CPython 3.11; the
random-module calls used (random, randint, choice, shuffle) are meant to give the same
streams on other CPython 3 versions (only 3.11 was checked).

    python3 tools/eval/make_rag_qa.py            # writes tests/data/rag_qa.jsonl + rag_qa_small.jsonl
    python3 tools/eval/make_rag_qa.py --check    # regenerates in memory, compares with the files
"""

import argparse
import hashlib
import json
import os
import random
import sys

from rag_qa_documents import (Ctx, MAX_CHARS, MIN_CHARS, RENDER, fmt_int, make_company, make_invention, make_landmark,
                              make_person, make_town)
from rag_qa_words import (DEVICES, INDUSTRIES, LANDMARK_KINDS, PROFESSIONS_FOUNDER, PROFESSIONS_INVENTOR,
                          PROFESSIONS_OTHER)

SEED = 20240516
N_CASES = 240
N_MULTI = 72  # 30% two-hop
N_DOCS = 6
N_SMALL = 12

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "rag_qa.jsonl")
OUT_SMALL = os.path.join(ROOT, "tests", "data", "rag_qa_small.jsonl")


# ----------------------------------------------------------------------------------------
# Questions
# ----------------------------------------------------------------------------------------

def person_answers(p):
    return [p["name"], p["last"]]


def river_answers(t):
    return [t["river"], t["river_root"]]


def metres_answers(lm):
    return [f"{lm['size']} metres", str(lm["size"])]


# Single-hop: relation -> (entity kind, question, answers)
SINGLE = {
    "person.birth_town": ("person", lambda e: f"In which town was {e['name']} born?",
                          lambda e: [e["birth_town"]]),
    "person.birth_year": ("person", lambda e: f"In which year was {e['name']} born?",
                          lambda e: [str(e["birth_year"])]),
    "person.death_year": ("person", lambda e: f"In which year did {e['name']} die?",
                          lambda e: [str(e["death_year"])]),
    "company.founder": ("company", lambda e: f"Who founded {e['name']}?",
                        lambda e: person_answers(e["founder"])),
    "company.year": ("company", lambda e: f"In which year was {e['name']} founded?",
                     lambda e: [str(e["year"])]),
    "company.hq": ("company", lambda e: f"In which town is {e['name']} headquartered?",
                   lambda e: [e["hq"]]),
    "company.employees": ("company", lambda e: f"How many people does {e['name']} employ?",
                          lambda e: [fmt_int(e["employees"])]),
    "landmark.year": ("landmark", lambda e: f"In which year was the {e['name']} completed?",
                      lambda e: [str(e["year"])]),
    "landmark.architect": ("landmark", lambda e: f"Who designed the {e['name']}?",
                           lambda e: person_answers(e["architect"])),
    "landmark.town": ("landmark", lambda e: f"In which town does the {e['name']} stand?",
                      lambda e: [e["town"]]),
    "landmark.size": ("landmark", lambda e: f"How {e['lkind'][1]} is the {e['name']}?",
                      metres_answers),
    "invention.inventor": ("invention", lambda e: f"Who invented the {e['name']}?",
                           lambda e: person_answers(e["inventor"])),
    "invention.year": ("invention", lambda e: f"In which year was the {e['name']} invented?",
                       lambda e: [str(e["year"])]),
    "invention.town": ("invention", lambda e: f"In which town was the first {e['name']} built?",
                       lambda e: [e["town"]]),
    "town.river": ("town", lambda e: f"On which river does {e['name']} lie?", river_answers),
    "town.year": ("town", lambda e: f"In which year was {e['name']} founded?",
                  lambda e: [str(e["year"])]),
    "town.population": ("town", lambda e: f"What is the population of {e['name']}?",
                        lambda e: [fmt_int(e["population"])]),
}

# Two-hop: relation -> (first-hop kind, bridge, second-hop kind, question, answers)
#   bridge "person:<field>" = the person in that field of the first entity (biography doc)
#   bridge "town:<field>"   = the town named in that field of the first entity (town doc)
MULTI = {
    "company.founder>person.birth_town": (
        "company", "person:founder",
        lambda a: f"In which town was the founder of {a['name']} born?",
        lambda b: [b["birth_town"]]),
    "company.founder>person.birth_year": (
        "company", "person:founder",
        lambda a: f"In which year was the founder of {a['name']} born?",
        lambda b: [str(b["birth_year"])]),
    "landmark.architect>person.birth_town": (
        "landmark", "person:architect",
        lambda a: f"In which town was the architect of the {a['name']} born?",
        lambda b: [b["birth_town"]]),
    "landmark.architect>person.death_year": (
        "landmark", "person:architect",
        lambda a: f"In which year did the architect of the {a['name']} die?",
        lambda b: [str(b["death_year"])]),
    "invention.inventor>person.birth_town": (
        "invention", "person:inventor",
        lambda a: f"In which town was the inventor of the {a['name']} born?",
        lambda b: [b["birth_town"]]),
    "company.hq>town.river": (
        "company", "town:hq",
        lambda a: f"On which river lies the town where {a['name']} is headquartered?",
        river_answers),
    "landmark.town>town.year": (
        "landmark", "town:town",
        lambda a: f"In which year was the town where the {a['name']} stands founded?",
        lambda b: [str(b["year"])]),
    "person.birth_town>town.population": (
        "person", "town:birth_town",
        lambda a: f"What is the population of the town where {a['name']} was born?",
        lambda b: [fmt_int(b["population"])]),
    "invention.town>town.river": (
        "invention", "town:town",
        lambda a: f"On which river lies the town where the first {a['name']} was built?",
        river_answers),
}


def make_entity(ctx, kind, like=None):
    """A fresh entity of `kind`; with `like`, a look-alike of that entity (same kind,
    sometimes the same name root or the same first name, different values)."""
    r = ctx.rng
    lookalike = like is not None and r.random() < 0.4
    if kind == "person":
        first = like["first"] if lookalike else None
        female = like["female"] if lookalike else None
        prof = like["profession"] if like is not None else r.choice(PROFESSIONS_OTHER)
        return make_person(ctx, prof, female=female, first=first)
    if kind == "company":
        founder = make_person(ctx, r.choice(PROFESSIONS_FOUNDER), born_hi=1880)
        if lookalike:
            ind = r.choice([i for i in INDUSTRIES if i[0] != like["industry"][0]])
            return make_company(ctx, founder, root=like["root"], industry=ind), founder
        return make_company(ctx, founder), founder
    if kind == "landmark":
        arch = make_person(ctx, "architect", born_hi=1890)
        if lookalike:
            k = r.choice([k for k in LANDMARK_KINDS if k[0] != like["lkind"][0]])
            return make_landmark(ctx, arch, root=like["root"], kind=k), arch
        return make_landmark(ctx, arch), arch
    if kind == "invention":
        inv = make_person(ctx, r.choice(PROFESSIONS_INVENTOR), born_hi=1890)
        if lookalike:
            d = r.choice([d for d in DEVICES if d[0] != like["device"][0]])
            return make_invention(ctx, inv, root=like["root"], device=d), inv
        return make_invention(ctx, inv), inv
    if kind == "town":
        return make_town(ctx)
    raise ValueError(kind)


def ent(x):
    return x[0] if isinstance(x, tuple) else x


KINDS = ["person", "company", "landmark", "invention", "town"]


def build_case(rng, relation, hops):
    """Returns (docs in generation order, gold indices in that order, question, answers,
    subject string, bridge string or None)."""
    ctx = Ctx(rng)
    ents = []  # entities that get a document, in generation order
    if hops == 1:
        kind, qf, af = SINGLE[relation]
        gold = ent(make_entity(ctx, kind))
        ents.append(gold)
        # Two look-alike documents of the same kind, three of other kinds.
        for _ in range(2):
            ents.append(ent(make_entity(ctx, kind, like=gold)))
        others = [k for k in KINDS if k != kind]
        for _ in range(3):
            ents.append(ent(make_entity(ctx, rng.choice(others))))
        question, answers = qf(gold), af(gold)
        subject = gold["name"]
        gold_idx, bridge = [0], None
    else:
        kind_a, bridge_spec, qf, af = MULTI[relation]
        bkind, field = bridge_spec.split(":")

        def chain(like_a=None):
            if kind_a == "person":
                a = make_entity(ctx, "person", like=like_a)
                a_ent = a
            else:
                a = make_entity(ctx, kind_a, like=like_a)
                a_ent = ent(a)
            if bkind == "person":
                b = a_ent[field]
            else:
                b = make_town(ctx, name=a_ent[field])
            return a_ent, b

        a, b = chain()
        a2, b2 = chain(like_a=a)  # look-alike chain
        ents += [a, b, a2, b2]
        others = [k for k in KINDS if k not in (kind_a, bkind)]
        for _ in range(2):
            ents.append(ent(make_entity(ctx, rng.choice(others))))
        question, answers = qf(a), af(b)
        subject = a["name"]
        bridge = b["name"]
        gold_idx = [0, 1]
    docs = [RENDER[e["kind"]](ctx, e) for e in ents]
    return docs, gold_idx, question, answers, subject, bridge


def valid(docs, gold_idx, answers, subject, bridge):
    ans_doc = gold_idx[-1]
    for i, d in enumerate(docs):
        if not (MIN_CHARS <= len(d) <= MAX_CHARS) or not d.isascii():
            return False
        for a in answers:
            if (a in d) != (i == ans_doc):
                return False
        if (subject in d) != (i == gold_idx[0]):
            return False
        if bridge is not None and (bridge in d) != (i in gold_idx):
            return False
    for a in answers:
        if a.startswith(("Yes", "yes", "No", "no")):
            return False
    return True


def generate():
    rng = random.Random(SEED)
    n_single = N_CASES - N_MULTI
    single_rel = [list(SINGLE)[i % len(SINGLE)] for i in range(n_single)]
    multi_rel = [list(MULTI)[i % len(MULTI)] for i in range(N_MULTI)]
    rng.shuffle(single_rel)
    rng.shuffle(multi_rel)
    plan = [(rel, 1) for rel in single_rel] + [(rel, 2) for rel in multi_rel]
    rng.shuffle(plan)
    # Balanced slot of the answer document, separately for 1-hop and 2-hop cases.
    slots = {h: [i % N_DOCS for i in range(n)] for h, n in ((1, n_single), (2, N_MULTI))}
    for h in (1, 2):
        rng.shuffle(slots[h])
    cases = []
    for idx, (rel, hops) in enumerate(plan):
        for _attempt in range(200):
            docs, gold_idx, q, answers, subject, bridge = build_case(rng, rel, hops)
            if valid(docs, gold_idx, answers, subject, bridge):
                break
        else:
            raise RuntimeError(f"case {idx}: no valid draw for {rel}")
        # Place the answer document in its balanced slot, everything else shuffled.
        ans_slot = slots[hops].pop()
        rest = [i for i in range(N_DOCS) if i != gold_idx[-1]]
        rng.shuffle(rest)
        order = rest[:ans_slot] + [gold_idx[-1]] + rest[ans_slot:]  # order[slot] = doc
        pos = {d: s for s, d in enumerate(order)}
        cases.append({
            "id": f"rag-{idx:04d}",
            "hops": hops,
            "relation": rel,
            "gold_doc": [pos[g] for g in gold_idx],
            "question": q,
            "answers": answers,
            "documents": [docs[d] for d in order],
        })
    return cases


def dump(cases):
    return "".join(json.dumps(c, ensure_ascii=True) + "\n" for c in cases)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate in memory and compare with the committed files")
    args = ap.parse_args()
    cases = generate()
    full, small = dump(cases), dump(cases[:N_SMALL])
    if args.check:
        ok = True
        for path, text in ((OUT, full), (OUT_SMALL, small)):
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
            print(f"{path}: {'identical' if same else 'DIFFERENT'}")
            ok = ok and same
        return 0 if ok else 1
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    for path, text in ((OUT, full), (OUT_SMALL, small)):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        print(f"{path}: {text.count(chr(10))} cases, sha256 "
              f"{hashlib.sha256(text.encode()).hexdigest()}")
    lens = [len(d) for c in cases for d in c["documents"]]
    hops2 = sum(c["hops"] == 2 for c in cases)
    print(f"hops=2: {hops2}/{len(cases)}; document chars {min(lens)}..{max(lens)} "
          f"(~{min(lens) / 4.2:.0f}..{max(lens) / 4.2:.0f} tokens at 4.2 chars/token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
