"""The entities of tools/eval/make_rag_qa.py's fictional world (people, companies,
landmarks, inventions, towns: each name unique in its case) and their documents: a lead
paragraph with every fact of the entity, then templated background prose, assembled to
TARGET_LO..TARGET_HI characters (MIN_CHARS..MAX_CHARS at most)."""
import re

from rag_qa_words import (ARMS, BLOCKED, CARVINGS, CENTURIES, COUNT_WORDS, DEVICES, FESTIVALS, FIRST_F, FIRST_M,
                          HOBBIES, INDUSTRIES, KNOWN_FOR, LANDMARK_KINDS, LEGEND_OBJ, MONTHS, MOTTOS, QUOTES,
                          RIVER_HEAD, RIVER_TAIL, ROOT_HEAD, ROOT_TAIL, SAINTS, SEASONS, SUBJECTS, SUR_HEAD,
                          SUR_TAIL, TOPICS, TOWN_HEAD, TOWN_INDUSTRY, TOWN_TAIL, WEEKDAYS)

MIN_CHARS, MAX_CHARS = 1400, 1900
TARGET_LO, TARGET_HI = 1500, 1800

def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def fmt_int(n):
    return f"{n:,}"


class Ctx:
    """Per-case name allocator: every generated name in a case is unique, and no generated
    name is a substring of another one (so substring tests on answers are meaningful)."""

    def __init__(self, rng):
        self.rng = rng
        self.used = []

    def _ok(self, name):
        if name.startswith(("No", "no", "Yes", "yes")):
            return False
        if any(a == b == c for a, b, c in zip(name, name[1:], name[2:])):
            return False  # "Kessstead"
        if re.search(r"(\w{2,3})\1", name.lower()) or name.lower() in BLOCKED:
            return False  # "Ululon", "Bellell"; real words and well-known names
        low = name.lower()
        for u in self.used:
            ul = u.lower()
            if low in ul or ul in low:
                return False
        return True

    def unique(self, make):
        for _ in range(1000):
            name = make()
            if self._ok(name):
                self.used.append(name)
                return name
        raise RuntimeError("name space exhausted")

    def surname(self):
        r = self.rng
        return self.unique(lambda: r.choice(SUR_HEAD) + r.choice(SUR_TAIL))

    def town(self):
        r = self.rng
        return self.unique(lambda: r.choice(TOWN_HEAD) + r.choice(TOWN_TAIL))

    def river_root(self):
        r = self.rng
        return self.unique(lambda: r.choice(RIVER_HEAD) + r.choice(RIVER_TAIL))

    def root(self):
        r = self.rng
        return self.unique(lambda: r.choice(ROOT_HEAD) + r.choice(ROOT_TAIL))

    def person(self, female=None, first=None):
        r = self.rng
        if female is None:
            female = r.random() < 0.5
        if first is None:
            first = r.choice(FIRST_F if female else FIRST_M)
        last = self.surname()
        return {"first": first, "last": last, "name": f"{first} {last}", "female": female}


# ----------------------------------------------------------------------------------------
# Entities
# ----------------------------------------------------------------------------------------

def make_person(ctx, profession, born_lo=1760, born_hi=1900, female=None, first=None):
    r = ctx.rng
    p = ctx.person(female=female, first=first)
    p["kind"] = "person"
    p["profession"] = profession
    p["birth_year"] = r.randint(born_lo, born_hi)
    p["birth_town"] = ctx.town()
    p["death_year"] = p["birth_year"] + r.randint(48, 91)
    return p


def make_company(ctx, founder, root=None, industry=None):
    r = ctx.rng
    if root is None:
        root = ctx.root()
    if industry is None:
        industry = r.choice(INDUSTRIES)
    name = f"{root} {industry[0]}"
    ctx.used.append(name)
    return {"kind": "company", "name": name, "root": root, "industry": industry,
            "founder": founder,
            "year": founder["birth_year"] + r.randint(24, 45),
            "hq": ctx.town(),
            "employees": r.choice([r.randint(12, 98) * 10, r.randint(11, 96) * 100])}


def make_landmark(ctx, architect, root=None, kind=None):
    r = ctx.rng
    if root is None:
        root = ctx.root()
    if kind is None:
        kind = r.choice(LANDMARK_KINDS)
    name = f"{root} {kind[0]}"
    ctx.used.append(name)
    size = r.randint(60, 480) if kind[1] == "long" else r.randint(24, 96)
    return {"kind": "landmark", "name": name, "root": root, "lkind": kind,
            "architect": architect,
            "year": architect["birth_year"] + r.randint(30, 62),
            "town": ctx.town(), "size": size}


def make_invention(ctx, inventor, root=None, device=None):
    r = ctx.rng
    if root is None:
        root = ctx.root()
    if device is None:
        device = r.choice(DEVICES)
    name = f"{root} {device[0]}"
    ctx.used.append(name)
    return {"kind": "invention", "name": name, "root": root, "device": device,
            "inventor": inventor,
            "year": inventor["birth_year"] + r.randint(22, 55),
            "town": ctx.town()}


def make_town(ctx, name=None):
    r = ctx.rng
    if name is None:
        name = ctx.town()
    river = ctx.river_root()
    return {"kind": "town", "name": name, "river_root": river, "river": f"{river} River",
            "year": r.randint(1050, 1690),
            "population": r.randint(12, 960) * 100}


# ----------------------------------------------------------------------------------------
# Rendering: fact sentences (fixed, plain phrasing) + filler sentences (templates)
# ----------------------------------------------------------------------------------------

class Aux:
    """Lazily drawn auxiliary values for one document's filler sentences."""

    def __init__(self, ctx, lo, hi, taboo_years):
        self.ctx, self.lo, self.hi = ctx, lo, max(lo + 5, hi)
        self.taboo = list(taboo_years)
        self.vals = {}

    def year(self, key, lo=None, hi=None):
        if key not in self.vals:
            r = self.ctx.rng
            lo = self.lo if lo is None else lo
            hi = self.hi if hi is None else max(lo + 5, hi)
            while True:
                y = r.randint(lo, hi)
                if y not in self.taboo:
                    break
            self.taboo.append(y)
            self.vals[key] = y
        return self.vals[key]

    def get(self, key, make):
        if key not in self.vals:
            self.vals[key] = make()
        return self.vals[key]


def pronouns(p):
    if p["female"]:
        return {"he": "she", "He": "She", "his": "her", "His": "Her", "him": "her"}
    return {"he": "he", "He": "He", "his": "his", "His": "His", "him": "him"}


def person_doc(ctx, p):
    r = ctx.rng
    pr = pronouns(p)
    name, last = p["name"], p["last"]
    by, dy = p["birth_year"], p["death_year"]
    a = Aux(ctx, by + 25, dy - 1, [by, dy])
    spouse = lambda: ctx.person(female=not p["female"])["name"]
    he, He, his, His = pr["he"], pr["He"], pr["his"], pr["His"]
    prof = p["profession"]
    art = "an" if prof[0] in "aeiou" else "a"
    opening = r.choice([
        f"{name} was {art} {prof} whose long career left a mark on the region.",
        f"{name} was {art} {prof} remembered for careful, patient work.",
        f"{name} was {art} {prof} and one of the better known figures of {his} generation.",
        f"This article describes the life of {name}, {art} {prof}.",
    ])
    born = f"{name} was born in {p['birth_town']} in {by}."
    died = f"{name} died in {dy} at the age of {dy - by}."
    P = lambda: ctx.person()["name"]
    fillers = [
        lambda: f"{His} father was a {r.choice(['carpenter', 'baker', 'schoolmaster', 'ferryman', 'tailor', 'clerk'])} and {his} mother kept a small {r.choice(['shop', 'bakery', 'inn', 'garden nursery'])} near the market square.",
        lambda: f"{last} studied {r.choice(SUBJECTS)} at the {ctx.root()} Academy and graduated with honours in {a.year('grad', by + 18, by + 26)}.",
        lambda: f"During {his} student years {he} wrote a short paper on {r.choice(TOPICS)} that attracted the attention of {a.get('mentor', P)}.",
        lambda: f"In {a.year('marry')} {he} married {a.get('spouse', spouse)}, a {r.choice(['singer', 'teacher', 'bookseller', 'nurse', 'translator', 'farmer'])} from a large family.",
        lambda: f"The couple had {r.choice(['two', 'three', 'four', 'five'])} children, one of whom later became a {r.choice(['doctor', 'judge', 'sea captain', 'painter', 'pharmacist'])}.",
        lambda: f"Contemporaries described {last} as patient, stubborn and unusually precise in {his} notes.",
        lambda: f"{His} notebooks, more than {r.randint(20, 140)} volumes in all, are now kept in the archive of the {ctx.root()} Society.",
        lambda: f"{He} travelled widely and visited workshops and lecture halls in {r.choice(COUNT_WORDS)} countries before settling down.",
        lambda: f"Although {he} received several offers to teach, {he} always preferred practical work to lecturing.",
        lambda: f"A bronze plaque on the house where {he} lived for many years was unveiled in {a.year('plaque', dy + 5, 2015)}.",
        lambda: f"{last} was elected a member of the {ctx.root()} Society in {a.year('soc')}.",
        lambda: f"In later life {he} suffered from poor eyesight but continued to dictate letters almost every day.",
        lambda: f"{His} letters to {a.get('corresp', P)} covered everything from {r.choice(TOPICS)} to the price of coal.",
        lambda: f"Several streets and a secondary school carry {his} name today.",
        lambda: f"{He} once remarked that {r.choice(QUOTES)}.",
        lambda: f"Historians still debate how much of {his} early work was shaped by {a.get('mentor', P)}, {his} first employer.",
        lambda: f"A biography by {P()} was published in {a.year('bio', dy + 1, 2015)} and has been reprinted twice.",
        lambda: f"{His} favourite pastimes were {r.choice(HOBBIES[:5])} and {r.choice(HOBBIES[5:])}.",
        lambda: f"{He} was known for answering every letter {he} received, even those from schoolchildren.",
        lambda: f"In {a.year('committee')} {he} served on a committee that advised the city council on {r.choice(['street lighting', 'drainage', 'public schools', 'harbour repairs', 'fire safety'])}.",
        lambda: f"An exhibition devoted to {his} life and work was held in {a.year('exh', dy + 10, 2015)} and drew {fmt_int(r.randint(40, 900) * 100)} visitors.",
        lambda: f"Friends remembered long evenings of conversation in {his} kitchen, where visitors were always offered bread and strong tea.",
        lambda: f"{He} kept a detailed diary for more than {r.randint(12, 40)} years, recording the weather, {his} expenses and the books {he} read.",
        lambda: f"At the height of {his} career {he} employed {r.randint(3, 30)} assistants and several apprentices.",
        lambda: f"{His} portrait, painted by {P()}, hangs in the reading room of the public library.",
        lambda: f"{He} was awarded a gold medal in {a.year('medal')} for services to the profession.",
    ]
    return assemble(r, opening, [born], fillers, [died])


def company_doc(ctx, c):
    r = ctx.rng
    name, yr = c["name"], c["year"]
    ind = c["industry"]
    a = Aux(ctx, yr + 1, min(2015, yr + 120), [yr, c["founder"]["birth_year"]])
    P = lambda: ctx.person()["name"]
    opening = r.choice([
        f"{name} is a company known for its {ind[1]}.",
        f"{name} is a firm whose {ind[1]} are sold across the country.",
        f"{name} is one of the older firms in its trade, best known for its {ind[1]}.",
    ])
    founded = f"{name} was founded by {c['founder']['name']} in {yr}."
    hq = f"{name} is headquartered in {c['hq']}."
    emp = f"{name} employs {fmt_int(c['employees'])} people."
    fillers = [
        lambda: f"In its first years the firm worked from a rented {r.choice(['warehouse', 'barn', 'stable yard', 'cellar'])} with only {r.randint(3, 19)} workers.",
        lambda: f"Its early customers were mostly {ind[2]}.",
        lambda: f"By {a.year('export')} the company had opened a second factory and begun exporting to {r.choice(COUNT_WORDS)} countries.",
        lambda: f"The firm survived a serious fire in {a.year('fire')}, which destroyed most of its stock and nearly bankrupted it.",
        lambda: f"A new chief engineer, {P()}, introduced a system of standard parts in {a.year('parts')}.",
        lambda: f"Its annual report for {a.year('report')} recorded a turnover of {fmt_int(r.randint(12, 990) * 1000)} crowns.",
        lambda: f"The company logo, a {r.choice(['blue', 'red', 'golden', 'black'])} {r.choice(['anchor', 'star', 'key', 'owl', 'crown', 'wheel'])}, has barely changed since it was first drawn.",
        lambda: f"Workers at the main plant went on strike for {plural(r.randint(2, 11), 'week')} in {a.year('strike')} over wages and working hours.",
        lambda: f"During the war years the factories were switched to making {ind[3]}.",
        lambda: f"In {a.year('md')} the board appointed {P()} as managing director.",
        lambda: f"The company sponsors a local football club and a music festival held every {r.choice(SEASONS)}.",
        lambda: f"Its museum, opened in {a.year('museum')}, displays early products and a reconstructed workshop.",
        lambda: f"Critics have accused the firm of being slow to innovate, although its {ind[1]} remain popular.",
        lambda: f"Shares of the company were first traded publicly in {a.year('shares')}.",
        lambda: f"A rival firm attempted a takeover in {a.year('takeover')}, but the bid was rejected by the shareholders.",
        lambda: f"The research department holds more than {r.randint(30, 900)} patents.",
        lambda: f"Apprentices at the firm follow a {r.choice(['two', 'three', 'four'])}-year training programme before they are allowed to work alone.",
        lambda: f"Its catalogue from {a.year('cat')} listed {r.randint(40, 600)} different models.",
        lambda: f"The company motto, \"{r.choice(MOTTOS)}\", is painted above the entrance of the main hall.",
        lambda: f"Visitors to the main plant can watch the production line from a glass gallery built above the floor.",
        lambda: f"The firm pays for an evening school where workers can learn reading, accounting and technical drawing.",
        lambda: f"In {a.year('flood')} a flood closed the works for {plural(r.randint(2, 9), 'month')}, and many machines had to be replaced.",
        lambda: f"The founder's office has been kept exactly as it was, with the original desk, ledgers and a wall clock.",
        lambda: f"About {r.randint(15, 70)} percent of its sales now come from abroad.",
        lambda: f"A company history written by {P()} appeared in {a.year('hist')}.",
    ]
    facts = [founded, hq, emp]
    r.shuffle(facts)
    return assemble(r, opening, facts, fillers, [])


def landmark_doc(ctx, lm):
    r = ctx.rng
    name, yr = lm["name"], lm["year"]
    kind, dim, material = lm["lkind"]
    k = kind.lower()
    a = Aux(ctx, yr + 1, min(2015, yr + 130), [yr, lm["architect"]["birth_year"]])
    P = lambda: ctx.person()["name"]
    opening = r.choice([
        f"The {name} is a {material} {k} and a protected monument.",
        f"The {name} is one of the best known {material} buildings of the region.",
        f"The {name} is a {k} built of {material}.",
    ])
    completed = f"The {name} was completed in {yr}."
    designed = f"The {name} was designed by the architect {lm['architect']['name']}."
    stands = f"The {name} stands in the town of {lm['town']}."
    size = f"The {name} is {lm['size']} metres {dim}."
    fillers = [
        lambda: f"Construction took {plural(r.randint(2, 14), 'year')} and employed up to {r.randint(80, 900)} labourers at its peak.",
        lambda: f"Most of the building material was brought by cart from the hills north of the town.",
        lambda: f"A public competition for the design attracted {r.randint(8, 90)} entries.",
        lambda: f"The original budget of {fmt_int(r.randint(20, 900) * 1000)} crowns was exceeded by nearly a third.",
        lambda: f"It was officially opened by the mayor, {P()}, in a ceremony attended by several thousand people.",
        lambda: f"The structure was damaged by a storm in {a.year('storm')} and repaired over the following {r.choice(['two', 'three', 'four'])} years.",
        lambda: f"A major restoration took place in {a.year('rest')}, when the {r.choice(['roof', 'foundations', 'iron railings', 'windows', 'stairs'])} were replaced.",
        lambda: f"Local legend claims that a {r.choice(LEGEND_OBJ)} is hidden somewhere inside the foundations.",
        lambda: f"Today the {k} appears on the town's coat of arms.",
        lambda: f"Painters and photographers have made it one of the most recognisable sights in the region.",
        lambda: f"Guided tours are offered every {r.choice(WEEKDAYS)} from {r.choice(MONTHS[:4])} to {r.choice(MONTHS[4:])}.",
        lambda: f"Around {fmt_int(r.randint(20, 900) * 100)} people visit the {k} each year.",
        lambda: f"Its main entrance is decorated with carvings of {r.choice(CARVINGS)}.",
        lambda: f"Engineers of the time considered the design daring because of its slender proportions.",
        lambda: f"Electric lighting was installed in {a.year('light')}.",
        lambda: f"An earlier wooden structure on the same site had burned down many years before.",
        lambda: f"A small museum next to the entrance tells the story of its construction.",
        lambda: f"During the war it was used as a {r.choice(['lookout post', 'storage depot', 'field hospital', 'signal station'])}.",
        lambda: f"The first stone was laid by {P()}, who also donated part of the money.",
        lambda: f"A commemorative coin showing the {k} was issued in {a.year('coin')}.",
        lambda: f"Pigeons nesting under the cornices have long been a problem for the caretakers.",
        lambda: f"Cracks found in {a.year('cracks')} led to a ban on heavy traffic for several months.",
        lambda: f"Its {r.choice(['iron gates', 'bronze doors', 'stone lions', 'stained glass windows'])} were made in a local workshop.",
        lambda: f"Every {r.choice(SEASONS)} the {k} is decorated with flags and lanterns for the town festival.",
    ]
    facts = [completed, designed, stands, size]
    r.shuffle(facts)
    return assemble(r, opening, facts, fillers, [])


def invention_doc(ctx, inv):
    r = ctx.rng
    name, yr = inv["name"], inv["year"]
    dev, mech, func, users, benefit = inv["device"]
    a = Aux(ctx, yr + 2, min(2010, yr + 70), [yr, inv["inventor"]["birth_year"]])
    end = a.year('end', yr + 30, min(2010, yr + 80))
    P = lambda: ctx.person()["name"]
    opening = r.choice([
        f"The {name} is an early {dev} that was widely copied.",
        f"The {name} was one of the first practical machines of its kind, a {dev} for {users}.",
        f"The {name} is a {dev} that changed the daily work of {users}.",
    ])
    invented = f"The {name} was invented by {inv['inventor']['name']} in {yr}."
    built = f"The first {name} was built in a workshop in {inv['town']}."
    fillers = [
        lambda: f"The device used a {mech} to {func}.",
        lambda: f"{users.capitalize()} quickly adopted it because it {benefit}.",
        lambda: f"Early versions were heavy and expensive, costing about {r.randint(12, 400)} crowns each.",
        lambda: f"Within a decade more than {fmt_int(r.randint(5, 900) * 100)} units had been sold across the continent.",
        lambda: f"An improved version introduced in {a.year('improved', yr + 2, end - 1)} was lighter and easier to repair.",
        lambda: f"Rival makers soon produced cheaper copies, which led to a long series of lawsuits.",
        lambda: f"The machine was shown at a trade fair in the capital, where it won a silver medal.",
        lambda: f"An original example survives in the collection of the {ctx.root()} Museum.",
        lambda: f"Historians note that similar ideas had been sketched earlier, but none had actually been built.",
        lambda: f"The {dev} remained in production until {end}.",
        lambda: f"Its success encouraged a generation of young mechanics to open their own workshops.",
        lambda: f"Newspapers of the time called it \"{r.choice(['the marvel of the age', 'the tireless servant', 'the little wonder', 'the clever box'])}\".",
        lambda: f"The first buyer was {P()}, who used it for more than twenty years.",
        lambda: f"A shortage of good steel meant that some parts had to be made of brass.",
        lambda: f"Instruction booklets were printed in {r.choice(COUNT_WORDS)} languages.",
        lambda: f"The original drawings, on {r.randint(12, 80)} large sheets, were rediscovered in {a.year('drawings', end + 1, 2012)}.",
        lambda: f"A museum replica built in {a.year('replica', end + 1, 2012)} still works and is demonstrated to visitors.",
        lambda: f"Some workers feared that the machine would take away their jobs, and a few examples were smashed.",
        lambda: f"The price fell by half once parts could be made in large numbers.",
        lambda: f"Engineers later praised the design for its small number of moving parts.",
        lambda: f"A larger model was developed by {P()} in {a.year('large', yr + 2, end - 1)}.",
        lambda: f"Collectors today pay high prices for examples in good condition.",
        lambda: f"Its name became so familiar that people used it for any {dev}, whoever had made it.",
        lambda: f"Repair shops for the {dev} opened in most market towns.",
    ]
    facts = [invented, built]
    r.shuffle(facts)
    return assemble(r, opening, facts, fillers, [])


def town_doc(ctx, t):
    r = ctx.rng
    name, yr = t["name"], t["year"]
    a = Aux(ctx, yr + 40, 2010, [yr])
    late = max(yr + 40, 1840)
    P = lambda: ctx.person()["name"]
    opening = r.choice([
        f"{name} is a market town with a well preserved old centre.",
        f"{name} is a small town surrounded by farmland and low hills.",
        f"{name} is a town with a long history of trade.",
    ])
    river = f"{name} lies on the {t['river']}."
    founded = f"{name} was founded in {yr}."
    pop = f"{name} has a population of {fmt_int(t['population'])}."
    fillers = [
        lambda: f"The town is known for its {r.choice(KNOWN_FOR)}.",
        lambda: f"Its market square is surrounded by {r.randint(14, 60)} timber-framed houses.",
        lambda: f"The main industries were once {r.choice(TOWN_INDUSTRY[:5])} and {r.choice(TOWN_INDUSTRY[5:])}, but today most residents work in services.",
        lambda: f"A railway station opened in {a.year('rail', late, 1935)}, and the journey to the capital now takes about {plural(r.randint(2, 6), 'hour')}.",
        lambda: f"The parish church of Saint {r.choice(SAINTS)} dates from the {r.choice(CENTURIES)} century.",
        lambda: f"A great fire in {a.year('fire')} destroyed much of the old centre.",
        lambda: f"The annual {r.choice(FESTIVALS)} festival takes place every {r.choice(MONTHS)}.",
        lambda: f"The town council has {r.randint(9, 31)} members and meets in the old guild hall.",
        lambda: f"The local football club plays in the regional league.",
        lambda: f"The climate is mild, with an average of {r.randint(90, 190)} rainy days per year.",
        lambda: f"A grammar school was founded in {a.year('school', yr + 50, 1900)}.",
        lambda: f"Its coat of arms shows a {r.choice(ARMS)}.",
        lambda: f"Several well known painters lived in the town during the {a.year('painters', max(yr + 100, 1600), 1960) // 10 * 10}s.",
        lambda: f"The river is crossed by {r.choice(COUNT_WORDS[:5])} bridges within the town limits.",
        lambda: f"The first mayor was {P()}, a wealthy wool merchant.",
        lambda: f"Old town walls survive on the northern side, together with two gate towers.",
        lambda: f"A weekly market is held every {r.choice(WEEKDAYS)} and draws farmers from the surrounding villages.",
        lambda: f"The town library holds about {fmt_int(r.randint(10, 95) * 1000)} books.",
        lambda: f"In {a.year('plague', yr + 20, 1880)} an outbreak of fever killed nearly a quarter of the inhabitants.",
        lambda: f"The harbour was deepened in {a.year('harbour', late, 1990)} so that larger barges could reach the warehouses.",
        lambda: f"The town museum displays tools, costumes and old photographs of daily life.",
        lambda: f"A hospital with {r.randint(40, 400)} beds serves the whole district.",
        lambda: f"Local cooks are proud of a thick soup made with beans, smoked pork and dill.",
        lambda: f"The town hall clock has been kept running by the same family for {r.choice(['three', 'four', 'five'])} generations.",
    ]
    facts = [river, founded, pop]
    r.shuffle(facts)
    return assemble(r, opening, facts, fillers, [])


def assemble(r, opening, facts, fillers, tail_facts):
    """A lead paragraph (opening sentence, then every fact sentence, with up to two filler
    sentences mixed in), then one or two paragraphs of filler sentences, until the document
    reaches a random target length in [TARGET_LO, TARGET_HI] (never MAX_CHARS)."""
    target = r.randint(TARGET_LO, TARGET_HI)
    facts = facts + tail_facts
    order = list(range(len(fillers)))
    r.shuffle(order)
    body = []
    total = len(opening) + sum(len(s) + 1 for s in facts)
    for i in order:
        s = fillers[i]()
        if total + len(s) + 2 > MAX_CHARS - 8:
            continue
        body.append(s)
        total += len(s) + 2
        if total >= target:
            break
    n_mixed = r.randint(0, 2)
    lead = list(facts)
    for s in body[:n_mixed]:
        lead.insert(r.randint(0, len(lead)), s)
    lead = [opening] + lead
    rest = body[n_mixed:]
    paras = [lead]
    if len(rest) >= 8 and r.random() < 0.6:
        cut = len(rest) // 2 + r.randint(-2, 2)
        paras += [rest[:cut], rest[cut:]]
    else:
        paras.append(rest)
    return "\n\n".join(" ".join(p) for p in paras)


RENDER = {"person": person_doc, "company": company_doc, "landmark": landmark_doc,
          "invention": invention_doc, "town": town_doc}
